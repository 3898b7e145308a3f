#include "client/elementwise.h"

#include "knod/client.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace knod::client {

namespace {

template <typename T> T apply_op(T a, T b, int op) {
    if constexpr (std::is_floating_point_v<T>) {
        switch (op) {
        case KNOD_CHUNK_SUM:
            return a + b;
        case KNOD_CHUNK_PRODUCT:
            return a * b;
        case KNOD_CHUNK_MIN:
            return std::isnan(a) ? a : std::isnan(b) ? b : (b < a ? b : a);
        default:
            return std::isnan(a) ? a : std::isnan(b) ? b : (b > a ? b : a);
        }
    } else {
        using U = std::make_unsigned_t<T>; // wraps as torch's integers do, without overflow UB
        switch (op) {
        case KNOD_CHUNK_SUM:
            return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        case KNOD_CHUNK_PRODUCT:
            return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
        case KNOD_CHUNK_MIN:
            return b < a ? b : a;
        default:
            return b > a ? b : a;
        }
    }
}

template <typename T>
void reduce_into(std::uint8_t *dst, const std::uint8_t *src, std::size_t n, int op) {
    std::size_t count = n / sizeof(T);
    for (std::size_t i = 0; i < count; ++i) {
        T a, b;
        std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
        std::memcpy(&b, src + i * sizeof(T), sizeof(T));
        a = apply_op(a, b, op);
        std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
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
