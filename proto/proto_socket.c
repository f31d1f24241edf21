/* proto_socket — the default socket path and the private-directory checks; see
 * proto_socket.h. Both ends of the socket compute the path here, so a daemon and its
 * clients never disagree (they once did: the client took a relative XDG_RUNTIME_DIR,
 * the daemon ignored it).
 *
 * Why a private directory: a socket path in a world-writable directory such as /tmp
 * can be bound by any user before the daemon starts, and a trainer would then talk to
 * that user's process. Only the owner can create names in a 0700 directory it owns, so
 * checking the directory (lstat: a symlink planted in its place is refused too) is
 * enough; clients also check the daemon's uid on the connection (SO_PEERCRED). */
#include "proto_socket.h"

#include "ld_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

void proto_socket_private_dir(char *buf, size_t size)
{
    snprintf(buf, size, "%s/loaderd-%u", LD_SOCKET_TMP_BASE, (unsigned)getuid());
}

/* A directory only this user can use: owned by us, no group or other bits. */
static bool socket_dir_private(const struct stat *st)
{
    return S_ISDIR(st->st_mode) && st->st_uid == getuid() && (st->st_mode & 077) == 0;
}

int proto_socket_default(char *buf, size_t size)
{
    const char *env = getenv("LOADERD_SOCKET");
    int n;
    struct stat st;
    if (env && *env) {
        n = snprintf(buf, size, "%s", env);
    } else if ((env = getenv("XDG_RUNTIME_DIR")) && env[0] == '/' && lstat(env, &st) == 0 &&
               socket_dir_private(&st)) {
        n = snprintf(buf, size, "%s/%s", env, LD_SOCKET_NAME);
    } else {
        char dir[64];
        proto_socket_private_dir(dir, sizeof dir);
        n = snprintf(buf, size, "%s/%s", dir, LD_SOCKET_NAME);
    }
    if (n < 0 || (size_t)n >= size) {
        if (size)
            buf[0] = '\0';
        return LD_ENAMETOOLONG;
    }
    return 0;
}

int proto_socket_check_dir(const char *dir, bool create, char *errbuf)
{
    struct stat st;
    if (lstat(dir, &st) < 0) {
        int e = errno;
        if (e != ENOENT || !create) {
            ld_errorf(errbuf, "socket directory %s: %s", dir, strerror(e));
            return ld_from_errno(e);
        }
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
            e = errno;
            ld_errorf(errbuf, "cannot create the socket directory %s: %s", dir, strerror(e));
            return ld_from_errno(e);
        }
        if (lstat(dir, &st) < 0) {
            e = errno;
            ld_errorf(errbuf, "socket directory %s: %s", dir, strerror(e));
            return ld_from_errno(e);
        }
    }
    if (!S_ISDIR(st.st_mode)) {
        ld_errorf(errbuf, "socket directory %s is not a directory (%s); refusing to use it", dir,
                  S_ISLNK(st.st_mode) ? "a symbolic link" : "another kind of file");
        return LD_ENOTDIR;
    }
    if (!socket_dir_private(&st)) {
        ld_errorf(errbuf,
                  "socket directory %s belongs to uid %u with mode 0%03o; it must belong to uid %u (this "
                  "user) with mode 0700, or another user could plant a socket in it: refusing to use it "
                  "(remove it, or set LOADERD_SOCKET / server.socket)",
                  dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)getuid());
        return LD_EACCES;
    }
    return 0;
}

int proto_socket_check_path(const char *path, bool create, char *errbuf)
{
    char dir[64];
    proto_socket_private_dir(dir, sizeof dir);
    size_t n = strlen(dir);
    if (strncmp(path, dir, n) != 0 || path[n] != '/' || strchr(path + n + 1, '/'))
        return 0;
    return proto_socket_check_dir(dir, create, errbuf);
}

int proto_socket_clear_stale(const char *path, const char *what, char *errbuf)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return 0;
    if (!S_ISSOCK(st.st_mode)) {
        ld_errorf(errbuf, "%s: '%s' exists and is not a socket; refusing to replace it", what, path);
        return LD_EEXIST;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    if (len >= sizeof sa.sun_path) {
        ld_errorf(errbuf, "%s: socket path '%s' is longer than %zu bytes", what, path, sizeof sa.sun_path - 1);
        return LD_ENAMETOOLONG;
    }
    memcpy(sa.sun_path, path, len + 1);
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int crc = probe >= 0 ? connect(probe, (struct sockaddr *)&sa, sizeof sa) : -1;
    int e = errno;
    if (probe >= 0)
        close(probe);
    if (crc == 0) {
        ld_errorf(errbuf, "%s: another process already serves '%s'", what, path);
        return LD_EADDRINUSE;
    }
    if (e != ECONNREFUSED) {
        ld_errorf(errbuf, "%s: cannot probe the existing socket '%s': %s", what, path, strerror(e));
        return ld_from_errno(e);
    }
    unlink(path);
    return 1;
}
