/* Unit tests for the object store client's pure parts: SigV4 against AWS's published
 * examples (the signature test suite's get-vanilla and get-vanilla-query-order-key-case,
 * and the S3 documentation's GET Object with a range and GET Bucket list), the URI
 * encoding, s3:// locations, endpoints, and where credentials come from (environment,
 * credentials file and profile) with a message that names where it looked and never a
 * secret. The requests themselves are tested against a real server
 * (client/python/tests/test_sources_s3.py). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ld_error.h"
#include "ld_wire.h"
#include "s3.h"
#include "s3_sign.h"

#define SUITE_KEY "AKIDEXAMPLE"
#define SUITE_SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define S3_DOC_KEY "AKIAIOSFODNN7EXAMPLE"
#define S3_DOC_SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

static void sign_suite(const char *query, const char *want_sig)
{
    struct s3_sign_header h[] = {{"x-amz-date", "20150830T123600Z"}, {"host", "example.amazonaws.com"}};
    struct s3_sign_request r = {
        .method = "GET", .canonical_uri = "/", .canonical_query = query, .headers = h, .n_headers = 2,
        .payload_sha256 = S3_SIGN_EMPTY_SHA256, .amz_date = "20150830T123600Z", .region = "us-east-1",
        .service = "service", .access_key = SUITE_KEY, .secret_key = SUITE_SECRET,
    };
    char out[S3_SIGN_AUTH_MAX], want[S3_SIGN_AUTH_MAX];
    assert_int_equal(s3_sign_authorization(&r, out, sizeof out), 0);
    snprintf(want, sizeof want, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
             "SignedHeaders=host;x-amz-date, Signature=%s", want_sig);
    assert_string_equal(out, want);
}

/* The signature test suite: get-vanilla, and get-vanilla-query-order-key-case (whose
 * query, Param2=value2&Param1=value1, signs in its sorted canonical form). */
static void test_sign_suite_vectors(void **state)
{
    (void)state;
    sign_suite("", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    sign_suite("Param1=value1&Param2=value2", "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

static void sign_s3_doc(const char *uri, const char *query, const char *range, const char *want_sig)
{
    struct s3_sign_header h[4] = {
        {"host", "examplebucket.s3.amazonaws.com"},
        {"x-amz-date", "20130524T000000Z"},
        {"x-amz-content-sha256", S3_SIGN_EMPTY_SHA256},
    };
    size_t n = 3;
    if (range)
        h[n++] = (struct s3_sign_header){"range", range};
    struct s3_sign_request r = {
        .method = "GET", .canonical_uri = uri, .canonical_query = query, .headers = h, .n_headers = n,
        .payload_sha256 = S3_SIGN_EMPTY_SHA256, .amz_date = "20130524T000000Z", .region = "us-east-1",
        .service = "s3", .access_key = S3_DOC_KEY, .secret_key = S3_DOC_SECRET,
    };
    char out[S3_SIGN_AUTH_MAX];
    assert_int_equal(s3_sign_authorization(&r, out, sizeof out), 0);
    const char *sig = strstr(out, "Signature=");
    assert_non_null(sig);
    assert_string_equal(sig + 10, want_sig);
    assert_non_null(strstr(out, "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "));
}

/* The S3 documentation's header-based examples: GET Object with Range: bytes=0-9, and
 * GET Bucket (list objects) with ?max-keys=2&prefix=J. */
static void test_sign_s3_doc_vectors(void **state)
{
    (void)state;
    sign_s3_doc("/test.txt", "", "bytes=0-9", "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
    sign_s3_doc("/", "max-keys=2&prefix=J", NULL, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

static void test_sign_rejects_bad_input(void **state)
{
    (void)state;
    struct s3_sign_header h[S3_SIGN_MAX_HEADERS + 1] = {{"host", "h"}};
    struct s3_sign_request r = {
        .method = "GET", .canonical_uri = "/", .canonical_query = "", .headers = h, .n_headers = 1,
        .payload_sha256 = S3_SIGN_EMPTY_SHA256, .amz_date = "20130524", .region = "r", .service = "s3",
        .access_key = "k", .secret_key = "s",
    };
    char out[S3_SIGN_AUTH_MAX];
    assert_int_equal(s3_sign_authorization(&r, out, sizeof out), LD_EINVAL);   /* a date without its time */
    r.amz_date = "20130524T000000Z";
    r.n_headers = S3_SIGN_MAX_HEADERS + 1;
    assert_int_equal(s3_sign_authorization(&r, out, sizeof out), LD_EINVAL);
    r.n_headers = 1;
    assert_int_equal(s3_sign_authorization(&r, out, 40), LD_ERANGE);
}

static void test_uri_encode(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(s3_sign_uri_encode("a/b c+d~e_f.g-h", 1, out, sizeof out), 19);
    assert_string_equal(out, "a/b%20c%2Bd~e_f.g-h");
    assert_true(s3_sign_uri_encode("a/b", 0, out, sizeof out) > 0);
    assert_string_equal(out, "a%2Fb");
    assert_true(s3_sign_uri_encode("\xc3\xa9=&", 0, out, sizeof out) > 0);    /* UTF-8 bytes, one by one */
    assert_string_equal(out, "%C3%A9%3D%26");
    assert_int_equal(s3_sign_uri_encode("abc", 0, out, 3), LD_ERANGE);
    assert_int_equal(s3_sign_uri_encode(" ", 0, out, 3), LD_ERANGE);
}

static void test_url_split(void **state)
{
    (void)state;
    char bucket[64], err[LD_ERRMSG_MAX];
    const char *prefix;
    assert_true(s3_is_url("s3://b"));
    assert_false(s3_is_url("/data/s3://b"));
    assert_int_equal(s3_url_split("s3://my-bucket.x/train/part 1/", bucket, sizeof bucket, &prefix, err), 0);
    assert_string_equal(bucket, "my-bucket.x");
    assert_string_equal(prefix, "train/part 1/");
    assert_int_equal(s3_url_split("s3://abc", bucket, sizeof bucket, &prefix, err), 0);
    assert_string_equal(prefix, "");
    assert_int_equal(s3_url_split("s3://ab/x", bucket, sizeof bucket, &prefix, err), LD_EINVAL);
    assert_non_null(strstr(err, "'s3://ab/x'"));
    assert_int_equal(s3_url_split("s3://a b/x", bucket, sizeof bucket, &prefix, err), LD_EINVAL);
    assert_int_equal(s3_url_split("s3:///x", bucket, sizeof bucket, &prefix, err), LD_EINVAL);
}

/* A credentials file in a temporary directory; the environment cleared of AWS keys. */
static char cred_dir[] = "/tmp/ld-test-s3.XXXXXX";
static char cred_path[64];

static int creds_setup(void **state)
{
    (void)state;
    if (!mkdtemp(cred_dir))
        return -1;
    snprintf(cred_path, sizeof cred_path, "%s/credentials", cred_dir);
    FILE *f = fopen(cred_path, "w");
    if (!f)
        return -1;
    fputs("# comment\n[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = default-secret\n\n"
          "; another\n[  work ]\naws_access_key_id=AKIAWORK\n  aws_secret_access_key =work-secret  \n"
          "aws_session_token = tok\n[empty]\n", f);
    fclose(f);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_REGION");
    unsetenv("AWS_DEFAULT_REGION");
    return 0;
}

static int creds_teardown(void **state)
{
    (void)state;
    unlink(cred_path);
    rmdir(cred_dir);
    return 0;
}

static void test_credentials_and_endpoints(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX] = "";
    s3_client *c = NULL;
    struct s3_options o = {.credentials_file = cred_path};

    /* The default profile, AWS's endpoint for the default region, virtual-hosted. */
    assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), 0);
    assert_string_equal(s3_client_describe(c), "https://bkt.s3.us-east-1.amazonaws.com (virtual-hosted, region "
                                                "us-east-1)");
    s3_client_free(c);

    /* A named profile (spaces around its name), another endpoint: path-style there. */
    o.profile = "work";
    o.endpoint = "http://127.0.0.1:9000/";
    o.region = "eu-west-3";
    assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), 0);
    assert_string_equal(s3_client_describe(c), "http://127.0.0.1:9000 (path-style, region eu-west-3)");
    s3_client_free(c);

    /* A profile without keys, and one that is not there: where it looked, no secret. */
    o.profile = "empty";
    assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), LD_EACCES);
    assert_non_null(strstr(err, "dataset 'x': no S3 credentials"));
    assert_non_null(strstr(err, cred_path));
    assert_non_null(strstr(err, "profile 'empty'"));
    o.profile = "nope";
    assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), LD_EACCES);
    assert_null(strstr(err, "default-secret"));
    assert_null(strstr(err, "work-secret"));

    /* The environment's keys, unless the config names a profile. */
    o.profile = NULL;
    setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
    setenv("AWS_PROFILE", "nope", 1);
    assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), 0);
    s3_client_free(c);
    unsetenv("AWS_ACCESS_KEY_ID");
    assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), LD_EACCES);   /* AWS_PROFILE=nope */
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_PROFILE");

    /* Endpoints that are not http(s)://HOST[:PORT]. */
    const char *bad[] = {"127.0.0.1:9000", "ftp://h", "http://", "http://h/path", "http://user@h"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.endpoint = bad[i];
        assert_int_equal(s3_client_new("dataset 'x'", "bkt", &o, &c, err), LD_EINVAL);
        assert_non_null(strstr(err, "s3.endpoint"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sign_suite_vectors),
        cmocka_unit_test(test_sign_s3_doc_vectors),
        cmocka_unit_test(test_sign_rejects_bad_input),
        cmocka_unit_test(test_uri_encode),
        cmocka_unit_test(test_url_split),
        cmocka_unit_test_setup_teardown(test_credentials_and_endpoints, creds_setup, creds_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
