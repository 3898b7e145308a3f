// Elementwise copy and reduction on raw bytes, shared by knod.distributed's receive paths: the
// sim's chunks (knod_chunks_receive) and the devmem stream (receive_stream_message). The element
// types and operations are the C API's (KNOD_CHUNK_* in knod/client.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace knod::client {

// Bytes per element of `dtype`; 0 for a type that is not one of KNOD_CHUNK_U8..F64.
std::size_t element_size(int dtype);

// Whether `op` (KNOD_CHUNK_COPY..MAX) and `dtype` can be applied: COPY takes any dtype.
bool valid_operation(int dtype, int op);

// dst[i] = dst[i] op src[i] for the n / element_size(dtype) whole elements of `n` bytes (COPY:
// copies n bytes). Integers wrap as torch's do; MIN and MAX pass NaN on.
void apply_elements(std::uint8_t *dst, const std::uint8_t *src, std::size_t n, int dtype, int op);

} // namespace knod::client
