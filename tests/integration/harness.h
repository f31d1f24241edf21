/* harness — what every integration test (tests/integration/itest_*.c) needs to drive a
 * real loaderd: a private temporary directory, a config written into it, the daemon as
 * a child process on a socket in that directory, a clean stop that must exit 0, a look
 * at /dev/shm for what the daemon left, and datasets whose every byte is known.
 *
 * The daemon binary is $LOADERD_BIN (set by scripts/run-tests.sh), else
 * "build/bin/loaderd" relative to the working directory (the repository root).
 *
 * Typical use, with cmocka fixtures so that a failing test still cleans up:
 *
 *     static int setup(void **state) {
 *         struct harness *h = harness_new();          // mkdtemp
 *         harness_gen_files(h, "rec", 1000, 256, 10, false);
 *         harness_write_config(h, "  workers: 2\n",
 *                              "  records:\n    kind: files\n    path: rec\n");
 *         harness_start(h);                           // fails the test if loaderd dies
 *         *state = h; return 0;
 *     }
 *     static int teardown(void **state) { harness_free(*state); return 0; }
 *     ... assert_int_equal(harness_stop(h), 0);       // clean exit, status 0
 *
 * Functions that can only fail because the machine is broken (mkdtemp, fork, write)
 * fail the running cmocka test themselves, with the reason, instead of returning codes
 * every test would have to check. */
#ifndef LD_HARNESS_H
#define LD_HARNESS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ld_mix.h"

struct harness {
    char dir[80];                /* the temporary directory (short: sockets live in it); removed by harness_free */
    char socket[108];            /* <dir>/s.sock: short, a Unix socket path holds 107 bytes */
    char config[PATH_MAX];       /* <dir>/loaderd.yaml */
    char log[PATH_MAX];          /* <dir>/loaderd.log: the daemon's stdout and stderr */
    pid_t pid;                   /* the running daemon, or 0 */
    uid_t run_uid;               /* when not 0: the daemon runs as this user... */
    gid_t run_gid;               /* ...and group (set before harness_start; needs root) */
};

/* Creates the temporary directory (under $TMPDIR, else /tmp). */
struct harness *harness_new(void);
/* Stops the daemon if it still runs (SIGKILL: a test that wanted a clean stop called
 * harness_stop), removes the directory recursively, frees h. Accepts NULL. */
void harness_free(struct harness *h);

/* Writes <dir>/loaderd.yaml:
 *     server:
 *       socket: <dir>/s.sock
 *     <server_extra>           (more server keys, each line indented by two spaces; may be NULL)
 *     datasets:
 *     <datasets>               (the caller's dataset entries, indented by two spaces)
 * Relative dataset paths are resolved by loaderd against <dir>. */
void harness_write_config(struct harness *h, const char *server_extra, const char *datasets);
/* Writes any file under the directory (e.g. a deliberately bad config). */
void harness_write_file(struct harness *h, const char *relpath, const void *data, size_t len);

/* Starts `loaderd --config <dir>/loaderd.yaml` with its output in h->log and waits up
 * to 10 s until the socket accepts a connection. The test fails (showing the log) if
 * the daemon exits first or the socket never answers. */
void harness_start(struct harness *h);
/* Starts loaderd as systemd's socket activation does: the test binds and listens on
 * h->socket itself (mode `mode`) and passes it as fd 3 with LISTEN_FDS=1 and LISTEN_PID;
 * the config's own socket is <dir>/unused.sock. Waits as harness_start does. The daemon
 * does not remove a socket it was given: harness_free does. */
void harness_start_activated(struct harness *h, unsigned mode);
/* Starts loaderd with extra arguments and does not wait: for tests of bad configs.
 * Returns the exit status as harness_stop does, after waiting up to 10 s for it. */
int harness_run_to_exit(struct harness *h, const char *const *extra_args);
/* Stops the daemon and proves the stop was clean: exit status 0 (the log is printed
 * otherwise) and nothing of its left in /dev/shm. Fails the test when not. */
void harness_stop_clean(struct harness *h);
/* Connects a client named `name` to the daemon, failing the test when it cannot. */
struct lc_client *harness_connect(struct harness *h, int timeout_ms, const char *name);

/* SIGTERM, then waits up to 10 s. Returns the exit status (0 for a clean stop),
 * 128 + signal when it died of a signal, -1 when it had to be killed after 10 s. */
int harness_stop(struct harness *h);
/* The same with another signal (SIGINT, SIGQUIT...). */
int harness_stop_with(struct harness *h, int sig);
/* Whether the daemon still runs (it has not exited). */
bool harness_alive(struct harness *h);
/* The daemon's log so far, as a malloc'd NUL-terminated string (never NULL). */
char *harness_log(const struct harness *h);

/* Runs $LOADERCTL_BIN (else build/bin/loaderctl) with `--socket <h->socket>` and the
 * NULL-terminated arguments, its stdout and stderr into out (size bytes, NUL-terminated,
 * cut when longer), and returns its exit status (128 + signal when it died of one).
 * Fails the test when it does not finish within 20 s. */
int harness_ctl(struct harness *h, char *out, size_t size, ...) __attribute__((sentinel));
/* One number from the daemon's status reply: `key`, or `key`.`sub` when sub is not
 * NULL (e.g. "slots", "leased"). Connects a client of its own for the request. */
double harness_status_num(struct harness *h, const char *key, const char *sub);
/* Slots leased across the daemon, from status; polls up to 2 s for the count to drop to
 * `at_most` or below (releases are pipelined), then returns what it saw. A stream whose
 * trainer holds no batch has at most LC_READ_AHEAD leased: the nexts the library asked
 * ahead, answered and waiting in its socket. */
int harness_wait_leased(struct harness *h, int at_most);
/* Releases are pipelined: they leave with the client's next request. A status request
 * on c sends the queued ones and waits until the daemon has answered them. */
/* Whether streams opened with the default options use the hand-off in shared memory
 * (LOADERD_HANDOFF=socket runs the same tests through the socket). */
bool harness_handoff_default(void);
void harness_flush_releases(struct lc_client *c);

/* Raw protocol access, for tests of what the library never sends: a connected socket
 * (the test fails when it cannot connect), one frame out, and the next frame in as a
 * malloc'd NUL-terminated JSON text (NULL when the daemon closed the connection or
 * nothing came within timeout_ms). */
int harness_raw_connect(const struct harness *h);
void harness_raw_send(int fd, const char *json);
char *harness_raw_reply(int fd, int timeout_ms);
/* The same, also taking a descriptor sent with the reply (SCM_RIGHTS): *ret_fd, or -1. */
char *harness_raw_reply_fd(int fd, int timeout_ms, int *ret_fd);

/* An unprivileged user `user` whose primary group is `group`, both created (useradd,
 * groupadd) when absent, for tests of what another user may do. Returns 0 with the ids,
 * or -1 when this process is not root (the caller skips, saying why); fails the test
 * when root cannot create them. */
int harness_test_user(const char *user, const char *group, uid_t *ret_uid, gid_t *ret_gid);
/* In a forked child: become uid/gid (group list: just gid). _exit(120) when it cannot. */
void harness_become(uid_t uid, gid_t gid);

/* Counts /dev/shm entries "loaderd.<pid>.*" (the rings of daemon `pid`) and, when buf is
 * not NULL, writes their names there separated by spaces, for failure messages. */
int harness_shm_count(pid_t pid, char *buf, size_t size);
/* Open file descriptors of this process (from /proc/self/fd), to prove none leaks. */
int harness_fd_count(void);

/* ---- datasets with known content (the rules of tools/gendata.c, GENDATA_VERSION 1) ----
 * files:  file i of n is <reldir>/class_CCC/IIIIIII.bin (CCC = i % classes) or
 *         <reldir>/IIIIIII.bin when classes is 0, zero-padded to 3 and 7 digits (more when
 *         needed) so that bytewise order is numeric order; its size is
 *         harness_file_size(i, size, vary) and byte j is harness_file_byte(i, j).
 *         loaderd's label of file i is i % classes (class folders in sorted order), or
 *         -1 when classes is 0.
 * tokens: token k is ld_splitmix64(k) % vocab, stored as uint16 or uint32 (host order). */
uint64_t harness_file_size(uint64_t i, uint64_t size, bool vary);
uint8_t harness_file_byte(uint64_t i, uint64_t j);
/* True when buf holds exactly file i's content. */
bool harness_file_matches(uint64_t i, const uint8_t *buf, uint64_t len, uint64_t size, bool vary);
void harness_gen_files(struct harness *h, const char *reldir, uint64_t n, uint64_t size, uint64_t classes,
                       bool vary);
uint64_t harness_token(uint64_t k, uint64_t vocab);
void harness_gen_tokens(struct harness *h, const char *relpath, uint64_t n, int token_bytes, uint64_t vocab);

#endif
