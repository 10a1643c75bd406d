// See file.h.
#include "loom/core/file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "loom/core/error.h"

namespace loom {

std::string os_error_text(int err) {
  const char* name = strerrorname_np(err);  // "ENOSPC"
  return fmt::format("{} ({})", std::generic_category().message(err), name ? name : "?");
}

namespace {
std::string os_error_hint(int err, const std::string& path) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "the disk (or quota) is full; free space or write somewhere else";
    case EFBIG:
      return "the file size limit was hit (ulimit -f, or the file system's maximum file size)";
    case ENOENT:
      return fmt::format("'{}' or a directory above it does not exist", path);
    case EACCES:
    case EPERM:
    case EROFS:
      return "check the permissions of the file and its directory";
    case EISDIR:
      return fmt::format("'{}' is a directory", path);
    default:
      return "";
  }
}

}  // namespace

[[noreturn]] void throw_os(const char* op, const std::string& path, int err) {
  throw Error(fmt::format("cannot {} '{}': {}", op, path, os_error_text(err)),
              os_error_hint(err, path));
}

const char* file_kind(mode_t mode) {
  return S_ISDIR(mode)                    ? "a directory"
         : S_ISFIFO(mode)                 ? "a FIFO"
         : S_ISSOCK(mode)                 ? "a socket"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
                                          : "not a file";
}

namespace {
constexpr const char* kWholeFileHint =
    "loom writes a file whole (a temporary renamed over it), which would replace it: give the path "
    "of a regular file";
}  // namespace

void check_output(std::string_view flag, const std::string& path,
                  std::initializer_list<NamedPath> inputs) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
    throw Error(
        fmt::format("{} {}: the directory '{}' does not exist or is not writable", flag, path, dir),
        "create it first, or give another path");
  struct stat out {};
  if (::stat(path.c_str(), &out) != 0) return;  // a new file
  if (!S_ISREG(out.st_mode))
    throw Error(fmt::format("{} {}: not a regular file ({})", flag, path, file_kind(out.st_mode)),
                kWholeFileHint);
  for (const NamedPath& in : inputs) {
    struct stat st {};
    if (::stat(in.path.c_str(), &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
      throw Error(fmt::format("{} {} is the file {} reads ({}): writing it would destroy it", flag,
                              path, in.flag, in.path),
                  "give another path");
  }
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  const bool here = std::filesystem::exists(path, ec);
  if (ec) throw_os("stat", path, ec.value());
  return here;
}

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw_os("create directory", path, ec.value());
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) throw_os("remove", path, ec.value());
}

std::string read_file(const std::string& path) {
  Fd fd = open_regular(path);
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (check_sys(n, "read", path) == 0) break;
    s.append(buf, size_t(n));
  }
  return s;
}

nlohmann::json read_json(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

template <class T>
T check_sys(T rc, const char* op, const std::string& path) {
  if (rc < 0) throw_os(op, path, errno);
  return rc;
}
template int check_sys<int>(int, const char*, const std::string&);
template ssize_t check_sys<ssize_t>(ssize_t, const char*, const std::string&);

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void Fd::close(const std::string& path) {
  int fd = fd_;
  fd_ = -1;
  check_sys(::close(fd), "close", path);
}

Fd open_checked(const std::string& path, int flags, mode_t mode, const char* op) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  return Fd(check_sys(fd, op, path));
}

Fd open_regular(const std::string& path) {
  int raw;
  do raw = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  while (raw < 0 && errno == EINTR);
  if (struct stat st{}; raw < 0 && errno == ENXIO && ::stat(path.c_str(), &st) == 0)
    throw Error(fmt::format("cannot read '{}': not a regular file ({})", path,  // a socket
                            file_kind(st.st_mode)));
  Fd fd(check_sys(raw, "read", path));
  struct stat st {};
  check_sys(::fstat(fd.get(), &st), "stat", path);
  if (!S_ISREG(st.st_mode))
    throw Error(
        fmt::format("cannot read '{}': not a regular file ({})", path, file_kind(st.st_mode)));
  const int flags = check_sys(::fcntl(fd.get(), F_GETFL), "fcntl", path);
  check_sys(::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK), "fcntl", path);
  return fd;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) throw_os("write", path, EIO);  // cannot happen for regular files; never spin
    check_sys(w, "write", path);
    p += w;
    n -= size_t(w);
  }
}

DirLock DirLock::acquire(const std::string& dir, const std::string& use) {
  const std::string path = dir + "/.lock";
  // never through a symbolic link (it could point at a file of another directory, which the
  // lock's pid would overwrite), and only a regular file
  int raw;
  do raw = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  while (raw < 0 && errno == EINTR);
  if (raw < 0 && errno == ELOOP)
    throw Error(fmt::format("{} {}: its lock file {} is a symbolic link", use, dir, path),
                "remove it (loom makes its own), or choose another directory");
  Fd fd(check_sys(raw, "open lock file", path));
  struct stat st {};
  check_sys(::fstat(fd.get(), &st), "stat", path);
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("{} {}: its lock file {} is not a regular file", use, dir, path),
                "remove it (loom makes its own), or choose another directory");
  int rc;
  do rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  while (rc < 0 && errno == EINTR);
  if (rc < 0 && errno == EWOULDBLOCK) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    std::string holder = n > 0 ? std::string(buf, size_t(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    throw Error(fmt::format("{} {} is in use: another process{} holds {}", use, dir,
                            holder.empty() ? "" : " (pid " + holder + ")", path),
                "wait for it to finish, or choose another directory");
  }
  check_sys(rc, "lock", path);
  const std::string pid = fmt::format("{}\n", ::getpid());
  check_sys(::ftruncate(fd.get(), 0), "truncate", path);
  check_sys(::pwrite(fd.get(), pid.data(), pid.size(), 0), "write", path);
  return DirLock(std::move(fd));
}

AppendFile::AppendFile(const std::string& path)
    : path_(path),
      fd_(open_checked(path, O_WRONLY | O_APPEND | O_CREAT, 0644, "open for append")) {}

void AppendFile::append(std::string_view line) {
  std::string s(line);
  s += '\n';
  write_all(fd_.get(), s.data(), s.size(), path_);
}

void AppendFile::sync() { check_sys(::fdatasync(fd_.get()), "sync", path_); }

size_t pread_full(int fd, void* data, size_t n, uint64_t offset, const char* op,
                  const std::string& path) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, std::min(n - got, size_t{1} << 30), off_t(offset + got));
    if (r < 0 && errno == EINTR) continue;
    check_sys(r, op, path);
    if (r == 0) break;
    got += size_t(r);
  }
  return got;
}

int64_t first_nonfinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

void fsync_directory(const std::string& dir) {
  Fd dfd = open_checked(dir, O_RDONLY | O_DIRECTORY, 0, "open directory");
  check_sys(::fsync(dfd.get()), "fsync directory", dir);
  dfd.close(dir);
}

void write_file_atomic(const std::string& path, std::span<const Bytes> parts) {
  if (struct stat st{}; ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(
        fmt::format("cannot write '{}': not a regular file ({})", path, file_kind(st.st_mode)),
        kWholeFileHint);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    Fd fd = open_checked(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644, "create");
    for (const Bytes& b : parts) write_all(fd.get(), b.data, b.size, tmp);
    check_sys(::fsync(fd.get()), "fsync", tmp);
    fd.close(tmp);
    check_sys(::rename(tmp.c_str(), path.c_str()), "rename the temporary file onto", path);
  } catch (const Error&) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable. If this fails, PATH already holds the complete new file.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  try {
    fsync_directory(dir);
  } catch (const Error& e) {
    throw Error(fmt::format("'{}' was written in full, but a crash could still undo it: {}", path,
                            e.what()));
  }
}

void write_file_atomic(const std::string& path, std::string_view text) {
  const Bytes part{text.data(), text.size()};
  write_file_atomic(path, std::span<const Bytes>(&part, 1));
}

}  // namespace loom
