/* Unit tests for the daemon's log: ld_require() lets a true requirement pass having
 * evaluated it once, and a false one logs file:line, the function and the expression
 * at error level (whatever the configured level) before it aborts. The aborting case
 * runs in a child process whose stderr is a pipe we read. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"

static int evaluations;

static int count_evaluation(int v)
{
    evaluations++;
    return v;
}

static void test_require_true_passes_once(void **state)
{
    (void)state;
    evaluations = 0;
    ld_require(count_evaluation(1) == 1);
    assert_int_equal(evaluations, 1);
}

static void require_fails(int two)
{
    ld_require(two + two == 5);
}
/* The line of the requirement above, which the message must name. */
static const int require_fails_line = __LINE__ - 3;

/* Runs require_fails() in a child with the log level at `level`; returns what the child
 * wrote on stderr (at most cap - 1 bytes) and its wait status. */
static int run_failing_child(int level, char *out, size_t cap)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        ld_log_set_level(level);
        require_fails(2);
        _exit(0); /* not reached: ld_require aborts */
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void test_require_false_logs_and_aborts(void **state)
{
    (void)state;
    char where[128];
    snprintf(where, sizeof where, "test_log.c:%d: require_fails: requirement failed: two + two == 5",
             require_fails_line);
    /* At the default level and at the quietest one alike. */
    const int levels[] = {LD_LOG_INFO, LD_LOG_ERROR};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        char out[4096];
        int status = run_failing_child(levels[i], out, sizeof out);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGABRT);
        assert_non_null(strstr(out, where));
        assert_non_null(strstr(out, " loaderd error: "));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_require_true_passes_once),
        cmocka_unit_test(test_require_false_logs_and_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
