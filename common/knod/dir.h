// Directory listing that never throws: std::filesystem's range-for over a directory_iterator
// throws filesystem_error when an increment fails (EACCES, EIO, a directory removed under it),
// and the daemon must never end on an uncaught exception (#17 item 10).
#pragma once

#include <filesystem>
#include <system_error>
#include <vector>

namespace knod {

// The entries of `dir` (full paths), in readdir order. On failure `ec` says why and the
// entries read so far are returned.
inline std::vector<std::filesystem::path> list_dir(const std::filesystem::path &dir,
                                                   std::error_code &ec) {
    std::vector<std::filesystem::path> out;
    std::filesystem::directory_iterator it(dir, ec), end;
    while (!ec && it != end) {
        out.push_back(it->path());
        it.increment(ec);
    }
    return out;
}

} // namespace knod
