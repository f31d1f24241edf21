/* beneath — the one way a `files` or `image_folder` dataset opens a file or a folder of
 * its tree: beneath its root, through no link that the scan did not see, and only if it
 * is a regular file. The rules and why they exist are in beneath.h.
 *
 * The common case, a sample that is a plain file, costs what a plain openat() did: one
 * openat2() with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS and one fstat(). A sample that the
 * scan found as a link costs more (its folder, the link, a readlink of the descriptor and
 * a re-open through /proc/self/fd), which links, being rare, can afford. Without
 * openat2 the walk opens each folder of the path with O_NOFOLLOW in turn, which a
 * rename racing with it cannot trick either: every step starts from a descriptor. */
#include "beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* O_NONBLOCK: opening a FIFO for reading would wait for a writer; O_NOCTTY: a terminal
 * swapped in must not become ours. O_NONBLOCK changes nothing for a regular file. */
#define BENEATH_READ_FLAGS (O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)

static int beneath_openat2(int dirfd, const char *rel, int oflags, uint64_t resolve)
{
    struct open_how how = {.flags = (uint64_t)oflags, .resolve = resolve};
    long fd;
    do
        fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : (int)fd;
}

/* The path a descriptor stands for, as the kernel sees it now; -errno on failure. */
static int beneath_fd_path(int fd, char *buf, size_t size)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(proc, buf, size - 1);
    if (n < 0)
        return -errno;
    if ((size_t)n >= size - 1)
        return -ENAMETOOLONG;
    buf[n] = '\0';
    return 0;
}

int beneath_root_open(const char *path, int links, unsigned flags, struct beneath *ret_root)
{
    struct beneath b = {.rootfd = -1, .links = links};
    char real[PATH_MAX];

    b.rootfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (b.rootfd < 0)
        return -errno;
    /* Probe once: a kernel before 5.6 answers ENOSYS, some container filters EPERM. */
    b.walk = (flags & BENEATH_ROOT_NO_OPENAT2) != 0;
    if (!b.walk) {
        int fd = beneath_openat2(b.rootfd, ".", O_PATH | O_CLOEXEC, RESOLVE_BENEATH);
        if (fd >= 0)
            close(fd);
        else if (fd == -ENOSYS || fd == -EPERM)
            b.walk = true;
    }
    /* Without /proc no followed link can be checked: links are then refused (below). */
    if (beneath_fd_path(b.rootfd, real, sizeof real) == 0 && real[0] == '/') {
        b.real = strdup(real);
        if (!b.real) {
            close(b.rootfd);
            return -ENOMEM;
        }
        b.real_len = strlen(real);
    }
    *ret_root = b;
    return 0;
}

void beneath_root_close(struct beneath *b)
{
    if (!b)
        return;
    if (b->rootfd >= 0)
        close(b->rootfd);
    b->rootfd = -1;
    free(b->real);
    b->real = NULL;
}

/* The walk without openat2: each folder of rel with O_NOFOLLOW from the one before,
 * then the last component with `oflags | O_NOFOLLOW`. The same answers as openat2 with
 * RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS for the paths the scan makes (no "." or ".."). */
static int beneath_walk(const struct beneath *b, const char *rel, int oflags)
{
    char comp[NAME_MAX + 1];
    int dir = b->rootfd, fd = -1;
    const char *p = rel;

    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || len > NAME_MAX || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) {
            fd = -EXDEV; /* not a path the scan makes: refuse rather than interpret */
            break;
        }
        memcpy(comp, p, len);
        comp[len] = '\0';
        if (!slash) {
            fd = openat(dir, comp, oflags | O_NOFOLLOW);
            if (fd < 0)
                fd = -errno;
            else if (oflags & O_PATH) {
                /* O_PATH | O_NOFOLLOW opens a link itself instead of failing. */
                struct stat st;
                if (fstat(fd, &st) < 0 || S_ISLNK(st.st_mode)) {
                    close(fd);
                    fd = -ELOOP;
                }
            }
            break;
        }
        int next = openat(dir, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            fd = -errno;
            break;
        }
        struct stat st;
        int bad = 0;
        if (fstat(next, &st) < 0)
            bad = -errno;
        else if (!S_ISDIR(st.st_mode))
            bad = S_ISLNK(st.st_mode) ? -ELOOP : -ENOTDIR;
        if (bad < 0) {
            fd = bad;
            close(next);
            break;
        }
        if (dir != b->rootfd)
            close(dir);
        dir = next;
        p = slash + 1;
    }
    if (dir != b->rootfd)
        close(dir);
    return fd;
}

/* Opens rel with no link in any component. */
static int beneath_plain(const struct beneath *b, const char *rel, int oflags)
{
    if (b->walk)
        return beneath_walk(b, rel, oflags);
    return beneath_openat2(b->rootfd, rel, oflags,
                           RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
}

int beneath_open_dir(const struct beneath *b, const char *rel, int *ret_fd)
{
    int fd;
    if (rel[0]) {
        fd = beneath_plain(b, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } else {
        fd = openat(b->rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            fd = -errno;
    }
    if (fd < 0)
        return fd;
    *ret_fd = fd;
    return 0;
}

/* A path a trainer wrote: links followed while they stay beneath (see beneath.h). */
static int beneath_trainer_path(const struct beneath *b, const char *rel, int oflags, int *ret_fd)
{
    int fd;
    if (!rel[0]) {
        fd = openat(b->rootfd, ".", oflags);
        fd = fd < 0 ? -errno : fd;
    } else if (!b->walk) {
        fd = beneath_openat2(b->rootfd, rel, oflags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
    } else {
        fd = beneath_walk(b, rel, oflags);
    }
    if (fd < 0)
        return fd;
    *ret_fd = fd;
    return 0;
}

int beneath_open_dir_path(const struct beneath *b, const char *rel, int *ret_fd)
{
    return beneath_trainer_path(b, rel, O_PATH | O_DIRECTORY | O_CLOEXEC, ret_fd);
}

int beneath_open_any(const struct beneath *b, const char *rel, int *ret_fd)
{
    return beneath_trainer_path(b, rel, O_PATH | O_CLOEXEC, ret_fd);
}

/* A link the scan found: its folder without links, then the link itself followed to
 * wherever it leads, as an O_PATH descriptor (no open of a device or FIFO out there);
 * then the end is checked against the root, and re-opened for reading through the
 * descriptor, so the file checked is the file read. */
static int beneath_link(const struct beneath *b, const char *rel, unsigned flags)
{
    char where[PATH_MAX];
    const char *slash = strrchr(rel, '/');
    int dir = b->rootfd, fd = -1, r;

    if (slash) {
        char parent[PATH_MAX];
        size_t len = (size_t)(slash - rel);
        if (len >= sizeof parent)
            return -ENAMETOOLONG;
        memcpy(parent, rel, len);
        parent[len] = '\0';
        dir = beneath_plain(b, parent, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0)
            return dir;
    }
    fd = openat(dir, slash ? slash + 1 : rel, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        goto out;
    }
    if (b->links != BENEATH_LINKS_OUTSIDE) {
        if (!b->real) {
            r = -EXDEV; /* no /proc: where it leads cannot be checked */
            goto out;
        }
        r = beneath_fd_path(fd, where, sizeof where);
        if (r < 0)
            goto out;
        bool inside = b->real_len == 1 /* the root is "/" */
                      || (strncmp(where, b->real, b->real_len) == 0 && where[b->real_len] == '/');
        if (!inside) {
            r = -EXDEV;
            goto out;
        }
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        r = S_ISDIR(st.st_mode) ? -EISDIR : BENEATH_ENOTREG;
        goto out;
    }
    if (flags & BENEATH_PATH) {
        r = fd;
        fd = -1;
        goto out;
    }
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    r = open(proc, BENEATH_READ_FLAGS);
    if (r < 0)
        r = -errno;

out:
    if (fd >= 0)
        close(fd);
    if (dir != b->rootfd)
        close(dir);
    return r;
}

int beneath_open(const struct beneath *b, const char *rel, unsigned flags, int *ret_fd, struct stat *ret_st)
{
    int oflags = (flags & BENEATH_PATH) ? O_PATH | O_CLOEXEC : BENEATH_READ_FLAGS;
    int fd = (flags & BENEATH_LINK) ? beneath_link(b, rel, flags) : beneath_plain(b, rel, oflags);
    if (fd < 0)
        return fd;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return S_ISDIR(st.st_mode) ? -EISDIR : BENEATH_ENOTREG;
    }
    if (ret_st)
        *ret_st = st;
    *ret_fd = fd;
    return 0;
}

const char *beneath_strerror(int rc, char *buf, size_t size)
{
    switch (rc) {
    case -EXDEV:
        return "a symbolic link that leads outside the dataset's directory (follow_links: outside allows it)";
    case -ELOOP:
        return "a symbolic link where the scan saw none (links to folders are not followed)";
    case BENEATH_ENOTREG:
        return "not a regular file (a FIFO, device, socket or folder is never read)";
    default:
        return strerror_r(-rc, buf, size);
    }
}
