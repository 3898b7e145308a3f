#include "client/elementwise.h"

#include "knod/client.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace knod::client {

namespace {

template <typename T, int Op> T apply_op(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        if constexpr (Op == KNOD_CHUNK_SUM)
            return a + b;
        else if constexpr (Op == KNOD_CHUNK_PRODUCT)
            return a * b;
        else if constexpr (Op == KNOD_CHUNK_MIN)
            return std::isnan(a) ? a : std::isnan(b) ? b : (b < a ? b : a);
        else
            return std::isnan(a) ? a : std::isnan(b) ? b : (b > a ? b : a);
    } else {
        using U = std::make_unsigned_t<T>; // wraps as torch's integers do, without overflow UB
        if constexpr (Op == KNOD_CHUNK_SUM)
            return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        else if constexpr (Op == KNOD_CHUNK_PRODUCT)
            return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
        else if constexpr (Op == KNOD_CHUNK_MIN)
            return b < a ? b : a;
        else
            return b > a ? b : a;
    }
}

// One loop per (type, op), the op a constant in it, over blocks of 64 bytes copied into locals:
// the compiler vectorizes the block (a switch on the op inside the loop, or a loop whose operands
// might alias, kept every element scalar at -O2; the receiver's reduction was the largest
// userspace symbol of a 16 MiB all_reduce's profile).
template <typename T, int Op>
void reduce_loop(std::uint8_t *dst, const std::uint8_t *src, std::size_t n) {
    constexpr std::size_t block = 64 / sizeof(T);
    std::size_t count = n / sizeof(T);
    std::size_t i = 0;
    for (; i + block <= count; i += block) {
        T a[block], b[block];
        std::memcpy(a, dst + i * sizeof(T), sizeof a);
        std::memcpy(b, src + i * sizeof(T), sizeof b);
        for (std::size_t j = 0; j < block; ++j)
            a[j] = apply_op<T, Op>(a[j], b[j]);
        std::memcpy(dst + i * sizeof(T), a, sizeof a);
    }
    for (; i < count; ++i) {
        T a, b;
        std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
        std::memcpy(&b, src + i * sizeof(T), sizeof(T));
        a = apply_op<T, Op>(a, b);
        std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
    }
}

template <typename T>
void reduce_into(std::uint8_t *dst, const std::uint8_t *src, std::size_t n, int op) {
    switch (op) {
    case KNOD_CHUNK_SUM:
        return reduce_loop<T, KNOD_CHUNK_SUM>(dst, src, n);
    case KNOD_CHUNK_PRODUCT:
        return reduce_loop<T, KNOD_CHUNK_PRODUCT>(dst, src, n);
    case KNOD_CHUNK_MIN:
        return reduce_loop<T, KNOD_CHUNK_MIN>(dst, src, n);
    default:
        return reduce_loop<T, KNOD_CHUNK_MAX>(dst, src, n);
    }
}

std::size_t element_size_of(int dtype) {
    switch (dtype) {
    case KNOD_CHUNK_U8:
    case KNOD_CHUNK_I8:
        return 1;
    case KNOD_CHUNK_I16:
        return 2;
    case KNOD_CHUNK_I32:
    case KNOD_CHUNK_F32:
        return 4;
    case KNOD_CHUNK_I64:
    case KNOD_CHUNK_F64:
        return 8;
    default:
        return 0;
    }
}

void reduce(std::uint8_t *dst, const std::uint8_t *src, std::size_t n, int dtype, int op) {
    switch (dtype) {
    case KNOD_CHUNK_U8:
        return reduce_into<std::uint8_t>(dst, src, n, op);
    case KNOD_CHUNK_I8:
        return reduce_into<std::int8_t>(dst, src, n, op);
    case KNOD_CHUNK_I16:
        return reduce_into<std::int16_t>(dst, src, n, op);
    case KNOD_CHUNK_I32:
        return reduce_into<std::int32_t>(dst, src, n, op);
    case KNOD_CHUNK_I64:
        return reduce_into<std::int64_t>(dst, src, n, op);
    case KNOD_CHUNK_F32:
        return reduce_into<float>(dst, src, n, op);
    default:
        return reduce_into<double>(dst, src, n, op);
    }
}

} // namespace

std::size_t element_size(int dtype) {
    return element_size_of(dtype);
}

bool valid_operation(int dtype, int op) {
    if (op == KNOD_CHUNK_COPY) return true;
    return op >= KNOD_CHUNK_SUM && op <= KNOD_CHUNK_MAX && element_size_of(dtype) != 0;
}

void apply_elements(std::uint8_t *dst, const std::uint8_t *src, std::size_t n, int dtype, int op) {
    if (op == KNOD_CHUNK_COPY)
        std::memcpy(dst, src, n);
    else
        reduce(dst, src, n, dtype, op);
}

} // namespace knod::client
