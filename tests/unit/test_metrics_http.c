/* Unit tests for the metrics listener's address (daemon/metrics_http.c) and its config
 * key: loopback TCP and absolute Unix paths are accepted, anything that would offer the
 * metrics to the network is refused by name, and config_load points at the value. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "ld_error.h"
#include "metrics_http.h"
#include "proto.h"

static void test_parse_accepts(void **state)
{
    struct metrics_listen l;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(metrics_http_parse_listen("unix:/run/loaderd/metrics.sock", &l, err), 0);
    assert_true(l.is_unix);
    assert_string_equal(l.path, "/run/loaderd/metrics.sock");

    assert_int_equal(metrics_http_parse_listen("127.0.0.1:9464", &l, err), 0);
    assert_false(l.is_unix);
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)&l.addr;
    assert_int_equal(in4->sin_family, AF_INET);
    assert_int_equal(ntohs(in4->sin_port), 9464);
    assert_int_equal(ntohl(in4->sin_addr.s_addr), 0x7f000001u);

    assert_int_equal(metrics_http_parse_listen("127.1.2.3:1", &l, err), 0);
    assert_int_equal(metrics_http_parse_listen("localhost:65535", &l, err), 0);
    assert_int_equal(ntohl(((const struct sockaddr_in *)&l.addr)->sin_addr.s_addr), 0x7f000001u);

    assert_int_equal(metrics_http_parse_listen("[::1]:9464", &l, err), 0);
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&l.addr;
    assert_int_equal(in6->sin6_family, AF_INET6);
    assert_int_equal(ntohs(in6->sin6_port), 9464);
    assert_true(IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr));
}

static void refused(const char *spec, const char *why)
{
    struct metrics_listen l;
    memset(&l, 0x5a, sizeof l);
    char err[LD_ERRMSG_MAX] = "";
    assert_int_equal(metrics_http_parse_listen(spec, &l, err), LD_EINVAL);
    if (!strstr(err, why))
        fail_msg("'%s': message '%s' does not say '%s'", spec, err, why);
    assert_int_equal(((unsigned char *)&l)[0], 0x5a); /* untouched */
}

static void test_parse_refuses(void **state)
{
    refused("0.0.0.0:9464", "0.0.0.0 is not a loopback address");
    refused("10.1.2.3:9464", "10.1.2.3 is not a loopback address");
    refused("[::]:9464", ":: is not a loopback address");
    refused("[2001:db8::1]:80", "2001:db8::1 is not a loopback address");
    refused("example.com:9464", "'example.com' is not a loopback address");
    refused("127.0.0.1:0", "the port must be an integer in [1, 65535]");
    refused("127.0.0.1:65536", "the port must be an integer in [1, 65535]");
    refused("127.0.0.1:", "the port must be an integer in [1, 65535]");
    refused("127.0.0.1:94x", "the port must be an integer in [1, 65535]");
    refused("9464", "expected unix:/ABSOLUTE/PATH");
    refused(":9464", "expected unix:/ABSOLUTE/PATH");
    refused("unix:metrics.sock", "a Unix socket needs an absolute path");
    refused("[::1:9464", "is not a loopback address");
    char long_path[200] = "unix:/";
    memset(long_path + 6, 'a', 150);
    long_path[156] = '\0';
    refused(long_path, "a Unix socket path holds at most 107");
}

static const char *tmp_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] == '/' ? t : "/tmp";
}

static int load(const char *yaml, struct config **ret, char *err)
{
    char path[256];
    snprintf(path, sizeof path, "%s/ld-test-metrics-XXXXXX.yaml", tmp_dir());
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    int rc = config_load(path, ret, err);
    if (rc < 0) {
        /* Messages start with the file's path; keep what follows it. */
        const char *rest = strstr(err, ".yaml:");
        if (rest)
            memmove(err, rest + 5, strlen(rest + 5) + 1);
    }
    unlink(path);
    return rc;
}

static void test_config_key(void **state)
{
    struct config *c = NULL;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(load("server:\n  socket: /tmp/x.sock\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err), 0);
    assert_null(c->metrics_listen); /* no listener unless configured */
    config_free(c);
    c = NULL;

    assert_int_equal(load("server:\n  socket: /tmp/x.sock\n  metrics: {listen: 127.0.0.1:9464}\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err),
                     0);
    assert_string_equal(c->metrics_listen, "127.0.0.1:9464");
    config_free(c);
    c = NULL;

    assert_int_equal(load("server:\n  metrics:\n    listen: unix:/run/loaderd/m.sock\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err), 0);
    assert_string_equal(c->metrics_listen, "unix:/run/loaderd/m.sock");
    config_free(c);

    struct config *untouched = (struct config *)(uintptr_t)0x5a5a5a50;
    c = untouched;
    assert_int_equal(load("server:\n  metrics: {listen: 0.0.0.0:9464}\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err), LD_ECONFIG);
    assert_ptr_equal(c, untouched);
    if (!strstr(err, ":2:21: server.metrics.listen: '0.0.0.0:9464': 0.0.0.0 is not a loopback address"))
        fail_msg("message: %s", err);
    assert_int_equal(load("server:\n  metrics: {}\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err), LD_ECONFIG);
    if (!strstr(err, "server.metrics: missing required key 'listen'"))
        fail_msg("message: %s", err);
    assert_int_equal(load("server:\n  metrics: {listen: 127.0.0.1:9464, port: 3}\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err),
                     LD_ECONFIG);
    if (!strstr(err, "unknown key 'port' in 'server.metrics' (expected one of: listen)"))
        fail_msg("message: %s", err);
    assert_int_equal(load("server:\n  metrics: unix:/x.sock\ndatasets:\n  d: {kind: files, path: /tmp}\n", &c, err), LD_ECONFIG);
    if (!strstr(err, "server.metrics: expected a mapping"))
        fail_msg("message: %s", err);
    assert_ptr_equal(c, untouched);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_accepts),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_config_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
