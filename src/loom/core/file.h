// Files, written so that a crash never leaves a half file where a reader expects a whole one, and
// POSIX calls that report failure as loom::Error naming the path and the OS error.
//
// write_file_atomic: PATH.tmp.<pid> is written in full and fsynced, renamed over PATH, and PATH's
// directory is fsynced. On failure the temporary file is removed and PATH keeps its old content.
// A PATH that exists and is not a regular file (a device, FIFO, socket or directory) is refused
// before anything is written: the rename would replace it (as root, /dev/null itself).
// Every message reads "cannot <op> '<path>': <strerror> (<ENAME>)" with a hint (full disk, missing
// directory, permissions, ...).
//
// Not here: reading formats (safetensors.h, data/shard.h), directories of files
// (train/checkpoint.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>

namespace loom {

struct Bytes {
  const void* data;
  size_t size;
};

// Writes the concatenation of `parts` to `path` atomically (see above).
void write_file_atomic(const std::string& path, std::span<const Bytes> parts);
void write_file_atomic(const std::string& path, std::string_view text);
// Makes renames and creations inside `dir` durable.
void fsync_directory(const std::string& dir);
// The whole file as bytes; throws "cannot read '<path>': ..." naming the OS error.
std::string read_file(const std::string& path);
// The file parsed as JSON; throws as read_file does, or "<path>: not valid JSON (...)".
nlohmann::json read_json(const std::string& path);
// Whether `path` exists (a dangling symlink does not). Any other failure to tell (no permission on
// a directory above it, a symlink loop) throws "cannot stat '<path>': ..." naming the OS error,
// never std::filesystem's exception.
bool path_exists(const std::string& path);
// std::filesystem::create_directories, a failure thrown as "cannot create directory '<path>': ...".
void make_directories(const std::string& path);
// std::filesystem::remove_all, a failure thrown as "cannot remove '<path>': ...".
void remove_tree(const std::string& path);
// Before the work whose result `flag` writes to `path`: throws "<flag> <path>: the directory ...
// does not exist or is not writable" unless path's directory is one this process can write in;
// "<flag> <path>: not a regular file (a device)" when it exists as something write_file_atomic
// would replace; and "<flag> <path> is <input flag>'s file" when it is the same file (device and
// inode) as one of the command's `inputs` (flag, path), which writing it would destroy.
struct NamedPath {
  std::string_view flag;
  std::string path;
};
void check_output(std::string_view flag, const std::string& path,
                  std::initializer_list<NamedPath> inputs = {});
// "a directory", "a FIFO", "a socket", "a device" or "not a file": what a stat's mode names.
const char* file_kind(mode_t mode);

// ---- checked POSIX calls ----

std::string os_error_text(int err);  // "No space left on device (ENOSPC)"
[[noreturn]] void throw_os(const char* op, const std::string& path, int err);

// Returns rc, or throws "cannot <op> '<path>': ..." when rc is negative (errno set).
template <class T>
T check_sys(T rc, const char* op, const std::string& path);

// Owns a file descriptor; close() reports errors, the destructor (failure paths only) ignores them.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&& o) noexcept;  // closes what it held (ignoring errors, as the destructor)
  int get() const { return fd_; }
  void close(const std::string& path);

 private:
  int fd_;
};

Fd open_checked(const std::string& path, int flags, mode_t mode, const char* op);
// Opens a regular file for reading, and nothing else: a FIFO, device, socket or directory is
// refused with "cannot read '<path>': not a regular file (a FIFO)" before anything waits on it
// (the open itself does not block: O_NONBLOCK, dropped once the file is known to be regular).
// Every reader of user-named files goes through it (read_file, safetensors, token shards).
Fd open_regular(const std::string& path);
void write_all(int fd, const void* data, size_t n, const std::string& path);
// Reads up to n bytes at `offset` into data, fewer only where the file ends; returns how many. An
// OS error throws "cannot <op> '<path>': ...". A caller that needs all n says what a short read
// means for it (a truncated file, one changed while open).
size_t pread_full(int fd, void* data, size_t n, uint64_t offset, const char* op,
                  const std::string& path);

// The index of the first NaN or infinity among x[0, n), or -1 when all are finite.
int64_t first_nonfinite(const float* x, int64_t n);

// An exclusive lock on directory `dir` (flock on DIR/.lock, which records the holder's pid), held
// while the object lives and released by the kernel if the process dies (no stale locks).
// acquire() never waits: a directory another process holds is a loom::Error naming the directory
// and that process, saying what `use` it is in.
class DirLock {
 public:
  static DirLock acquire(const std::string& dir, const std::string& use);
  DirLock(DirLock&&) noexcept = default;

 private:
  explicit DirLock(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
};

// A file lines are appended to, each write checked (a full disk is an error naming the file, not
// a silently shorter log); sync() makes what was appended durable (fdatasync), checked too.
class AppendFile {
 public:
  explicit AppendFile(const std::string& path);  // created if absent
  void append(std::string_view line);            // writes line + "\n"
  void sync();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Fd fd_;
};

}  // namespace loom
