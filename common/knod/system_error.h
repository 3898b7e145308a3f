// An errno turned into a knod::Error that says which resource ran out, when one did. A full
// fd table, a full disk or no memory is not "the process is gone" or "no such file": the
// caller, the log and `status` must say what is missing and what fixes it.
#pragma once

#include "knod/result.h"

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

namespace knod {

// The resource behind `err`, with what fixes it; nullopt for an errno that is not exhaustion.
inline std::optional<std::string> exhausted_resource(int err) {
    switch (err) {
    case EMFILE:
        return std::string("the daemon's open-file limit is reached (EMFILE; LimitNOFILE= of the "
                           "unit)");
    case ENFILE:
        return std::string("the system's file table is full (ENFILE; fs.file-max)");
    case ENOMEM:
        return std::string("out of memory (ENOMEM)");
    case ENOSPC:
        return std::string("no space left on the device (ENOSPC)");
    case EDQUOT:
        return std::string("the disk quota is exceeded (EDQUOT)");
    case ENOBUFS:
        return std::string("out of kernel buffer space (ENOBUFS)");
    default:
        return std::nullopt;
    }
}

// `what` failed with `err`: Errc::out_of_resources naming the resource when it ran out,
// otherwise `otherwise` with strerror(err).
inline Error system_error(Errc otherwise, int err, const std::string &what) {
    if (auto res = exhausted_resource(err))
        return make_error(Errc::out_of_resources, what + ": " + *res);
    return make_error(otherwise, what + ": " + std::strerror(err));
}

} // namespace knod
