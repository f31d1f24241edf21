/* sweep — the one sweep of files left by dead processes, for the rings in /dev/shm and
 * the cache builders' temporary files; see sweep.h. The directory is read once with
 * readdir and each candidate checked and removed relative to the directory's fd, so a
 * name that is replaced by a link or a directory meanwhile is not followed. */
#include "sweep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ld_error.h"
#include "log.h"

bool sweep_pid_dead(pid_t pid)
{
    if (pid <= 0)
        return false;               /* 0 and negatives signal groups, never one process */
    return kill(pid, 0) < 0 && errno == ESRCH;
}

int sweep_dead_owners(const char *dir, sweep_owner_fn owner, void *ctx, const char *what, char *errbuf)
{
    char ebuf[128];
    DIR *dp = opendir(dir);
    if (!dp) {
        int e = errno;
        ld_errorf(errbuf, "%s '%s': %s", what, dir, strerror_r(e, ebuf, sizeof ebuf));
        return ld_from_errno(e);
    }
    int dfd = dirfd(dp);
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        pid_t pid = owner(de->d_name, ctx);
        if (pid <= 0 || !sweep_pid_dead(pid))
            continue;
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (unlinkat(dfd, de->d_name, 0) == 0) {
            removed++;
            ld_log(LD_LOG_DEBUG, "%s '%s': removed '%s', left by dead process %ld", what, dir, de->d_name,
                   (long)pid);
        } else {
            ld_log(LD_LOG_WARN, "%s '%s': cannot remove '%s', left by dead process %ld: %s", what, dir,
                   de->d_name, (long)pid, strerror_r(errno, ebuf, sizeof ebuf));
        }
    }
    closedir(dp);
    return removed;
}
