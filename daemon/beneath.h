/* beneath — opening a dataset's files without ever leaving the dataset.
 *
 * A dataset is a directory tree that other people may change while the daemon (often
 * running as root or as a service user) reads it: a sample may become a symbolic link
 * to /etc/shadow, a class folder a link to another tree, a file a FIFO that would hang
 * a worker in open(). Every path of a `files` or `image_folder` dataset is therefore
 * resolved here, relative to a descriptor of the dataset's root that is opened once:
 *
 *   - no component of the path may be a symbolic link, except the last one of an entry
 *     that the scan recorded as a link (BENEATH_LINK); a link swapped in later anywhere
 *     in the path is refused (ELOOP);
 *   - a followed link must end beneath the root (EXDEV otherwise) unless the dataset
 *     allows links outside it (BENEATH_LINKS_OUTSIDE);
 *   - the file is opened O_NONBLOCK | O_NOCTTY | O_CLOEXEC and must be a regular file
 *     (BENEATH_ENOTREG otherwise), so no FIFO, device or socket is ever read.
 *
 * openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS does the first rule in one
 * system call; where the kernel or a seccomp filter refuses it (ENOSYS, EPERM), the
 * same rules are checked one component at a time with O_NOFOLLOW. The end of a followed
 * link is checked on the opened descriptor (/proc/self/fd), which no later rename can
 * change. Thread-safe: a struct beneath is read-only after beneath_root_open. */
#ifndef LD_BENEATH_H
#define LD_BENEATH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* Where a symbolic link that the scan found may lead (the dataset's follow_links). */
enum beneath_links {
    BENEATH_LINKS_INSIDE = 0,       /* only to a file beneath the root */
    BENEATH_LINKS_OUTSIDE = 1,      /* anywhere */
};

/* Flags of beneath_open. */
enum beneath_flags {
    BENEATH_LINK = 1u << 0,         /* the entry is a link: follow it, per the root's policy */
    BENEATH_PATH = 1u << 1,         /* locate and stat only (O_PATH): nothing is read */
};

/* Flags of beneath_root_open. */
enum beneath_root_flags {
    BENEATH_ROOT_NO_OPENAT2 = 1u << 0, /* use the component-wise walk even where openat2 works */
};

/* Returned for a path that names something other than a regular file. */
#define BENEATH_ENOTREG (-4100)

struct beneath {
    int rootfd;                     /* O_PATH | O_DIRECTORY descriptor of the root */
    int links;                      /* enum beneath_links */
    bool walk;                      /* no openat2: resolve component by component */
    char *real;                     /* the root as /proc/self/fd shows it (NULL: unknown) */
    size_t real_len;
};

/* Opens the root directory `path` (following links in `path` itself: the operator
 * wrote it). 0, or -errno with b untouched. */
int beneath_root_open(const char *path, int links, unsigned flags, struct beneath *ret_root);
/* Closes the root's descriptor and frees. Accepts a zeroed or closed struct (rootfd -1). */
void beneath_root_close(struct beneath *b);

/* Opens directory `rel` ("" is the root) for reading its entries; no component may be
 * a link. *ret_fd on success; 0 or -errno. */
int beneath_open_dir(const struct beneath *b, const char *rel, int *ret_fd);

/* Opens the regular file `rel` (relative, no "." or ".." components) by the rules
 * above: *ret_fd (O_RDONLY, or O_PATH with BENEATH_PATH) and, when ret_st is not NULL,
 * its fstat. 0, or a negative code: -EXDEV (a link leads outside the root), -ELOOP (a
 * link where none may be), -EISDIR, BENEATH_ENOTREG (a FIFO, device or socket), or
 * another -errno from the system. Never
 * blocks on the file's type (FIFOs are opened non-blocking, then refused). */
int beneath_open(const struct beneath *b, const char *rel, unsigned flags, int *ret_fd, struct stat *ret_st);

/* Opens directory `rel` (relative; "" is the root) as an O_PATH descriptor for a path
 * someone other than the operator wrote (a trainer's declared dataset, declare.h):
 * symbolic links are followed while they stay beneath the root and magic links
 * (/proc/PID/fd/N) never are: openat2 with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS.
 * -EXDEV when a link or ".." leads outside; where openat2 is refused, the walk allows
 * no link at all (-ELOOP). *ret_fd on success; 0 or -errno. */
int beneath_open_dir_path(const struct beneath *b, const char *rel, int *ret_fd);
/* The same for any file (O_PATH, following links that stay beneath): for a stat. */
int beneath_open_any(const struct beneath *b, const char *rel, int *ret_fd);

/* A sentence for a code of beneath_open ("leads outside the dataset's directory ...");
 * uses buf for errno texts. */
const char *beneath_strerror(int rc, char *buf, size_t size);

#endif
