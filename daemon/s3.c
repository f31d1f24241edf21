/* s3 — listing and ranged reads against an S3-compatible store (see s3.h).
 *
 * Every request is built the same way (s3_request_prepare): the URL (path-style or
 * virtual-hosted), the headers the signature covers (host, range, x-amz-content-sha256,
 * x-amz-date, x-amz-security-token) and the Authorization header, signed at the moment
 * of each attempt so a retry after a long wait still carries a current date. The Host
 * header is set explicitly so that what is signed is exactly what is sent.
 *
 * Reads (s3_get_many) run their parts on one curl multi handle owned by the call; the
 * easy handles come from the client's pool and the connections from its share object,
 * so neither the handles nor the TCP/TLS connections are made again per sample. An
 * answer's body is written straight into the caller's buffer when the status is 200 or
 * 206; any other status collects the body (an S3 error document, a few hundred bytes)
 * to name S3's error code in the message. Listing (s3_list) is one request at a time,
 * page after page, parsed with libxml2. */
#include "s3.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/crypto.h>

#include "ld_error.h"
#include "ld_wire.h"
#include "s3_sign.h"

#define S3_DEFAULT_PART (8u << 20)
#define S3_DEFAULT_PARALLEL 16u
#define S3_DEFAULT_TIMEOUT 30u
#define S3_DEFAULT_CONNECT_TIMEOUT 10u
#define S3_ERROR_BODY_MAX 4096u
#define S3_LIST_BODY_MAX (64u << 20)
#define S3_BACKOFF_FIRST_MS 100u
#define S3_BACKOFF_MAX_MS 5000u
#define S3_KEY_MAX 1024u            /* S3's own limit on a key's length */
#define S3_URL_MAX (3 * S3_KEY_MAX + 1024)

struct s3_client {
    char what[LD_ERRMSG_MAX / 4];
    char bucket[64];
    char scheme[8];                 /* "http" or "https" */
    char host[256];                 /* the endpoint's host[:port], or bucket.host[:port] when virtual */
    bool path_style;
    char region[64];
    char access_key[129];
    char secret_key[129];
    char *session_token;
    uint64_t part_size;
    uint32_t parallel, retries, timeout_s, connect_timeout_s;
    char describe[400];
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    pthread_mutex_t pool_lock;
    CURL **pool;                    /* idle easy handles */
    size_t n_pool, cap_pool;
};

static pthread_once_t s3_once = PTHREAD_ONCE_INIT;
static CURLcode s3_global_rc;

/* curl_global_init and xmlInitParser are not safe to run concurrently with anything
 * else in the process: once, before the first client is used. */
static void s3_global_init(void)
{
    s3_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    xmlInitParser();
}

bool s3_is_url(const char *path)
{
    return path && strncmp(path, "s3://", 5) == 0;
}

int s3_url_split(const char *url, char *bucket, size_t cap, const char **ret_prefix, char *errbuf)
{
    if (!s3_is_url(url)) {
        ld_errorf(errbuf, "'%s' is not an s3:// location", url);
        return LD_EINVAL;
    }
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t len = slash ? (size_t)(slash - b) : strlen(b);
    /* S3's rule: 3 to 63 characters of a-z 0-9 . -, starting and ending with a letter
     * or digit (older buckets may hold capitals and '_': let the store judge those). */
    bool ok = len >= 3 && len <= 63 && len < cap;
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)b[i]) || b[i] == '.' || b[i] == '-' || b[i] == '_';
    if (!ok) {
        ld_errorf(errbuf, "'%s': expected s3://BUCKET/PREFIX with a bucket name of 3 to 63 characters "
                  "(letters, digits, '.', '-')", url);
        return LD_EINVAL;
    }
    memcpy(bucket, b, len);
    bucket[len] = '\0';
    *ret_prefix = slash ? slash + 1 : "";
    return 0;
}

/* ---- credentials --------------------------------------------------------------------- */

static char *s3_trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static int s3_set_secret(char *dst, size_t cap, const char *v, const char *what, const char *name, char *errbuf)
{
    size_t n = strlen(v);
    if (n == 0 || n >= cap) {
        ld_errorf(errbuf, "%s: %s must be 1 to %zu characters", what, name, cap - 1);
        return LD_EINVAL;
    }
    memcpy(dst, v, n + 1);
    return 0;
}

/* The profile's keys from an INI-style credentials file: "[name]" sections of
 * "key = value" lines, '#' and ';' comments. LD_ENOENT when the file or the profile
 * is not there. */
static int s3_credentials_file(s3_client *c, const char *path, const char *profile, char *errbuf)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return LD_ENOENT;
    char line[4096];
    bool in = false, found = false;
    int rc = 0;
    while (fgets(line, sizeof line, f)) {
        char *s = s3_trim(line);
        if (!*s || *s == '#' || *s == ';')
            continue;
        if (*s == '[') {
            char *end = strchr(s, ']');
            if (end)
                *end = '\0';
            in = strcmp(s3_trim(s + 1), profile) == 0;
            found |= in;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in || !eq)
            continue;
        *eq = '\0';
        const char *k = s3_trim(s), *v = s3_trim(eq + 1);
        if (strcmp(k, "aws_access_key_id") == 0)
            rc = s3_set_secret(c->access_key, sizeof c->access_key, v, c->what, "aws_access_key_id", errbuf);
        else if (strcmp(k, "aws_secret_access_key") == 0)
            rc = s3_set_secret(c->secret_key, sizeof c->secret_key, v, c->what, "aws_secret_access_key", errbuf);
        else if (strcmp(k, "aws_session_token") == 0) {
            free(c->session_token);
            if (!(c->session_token = strdup(v)))
                rc = LD_ENOMEM;
        }
        if (rc < 0)
            break;
    }
    OPENSSL_cleanse(line, sizeof line);
    fclose(f);
    if (rc < 0)
        return rc;
    return found ? 0 : LD_ENOENT;
}

static int s3_credentials(s3_client *c, const struct s3_options *opt, char *errbuf)
{
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    int rc;

    /* A profile named in the config wins over the environment, as --profile does for
     * the AWS CLI; otherwise the environment's keys come first. */
    if (!opt->profile && id && *id && secret && *secret) {
        if ((rc = s3_set_secret(c->access_key, sizeof c->access_key, id, c->what, "AWS_ACCESS_KEY_ID", errbuf)) < 0 ||
            (rc = s3_set_secret(c->secret_key, sizeof c->secret_key, secret, c->what, "AWS_SECRET_ACCESS_KEY",
                                errbuf)) < 0)
            return rc;
        const char *token = getenv("AWS_SESSION_TOKEN");
        if (token && *token && !(c->session_token = strdup(token)))
            return LD_ENOMEM;
        return 0;
    }
    const char *profile = opt->profile ? opt->profile : getenv("AWS_PROFILE");
    if (!profile || !*profile)
        profile = "default";
    char path[4096];
    const char *file = opt->credentials_file ? opt->credentials_file : getenv("AWS_SHARED_CREDENTIALS_FILE");
    if (file && *file) {
        snprintf(path, sizeof path, "%s", file);
    } else {
        const char *home = getenv("HOME");
        struct passwd pw, *res = NULL;
        char pwbuf[1024];
        if ((!home || !*home) && getpwuid_r(getuid(), &pw, pwbuf, sizeof pwbuf, &res) == 0 && res)
            home = res->pw_dir;
        snprintf(path, sizeof path, "%s/.aws/credentials", home ? home : "");
    }
    rc = s3_credentials_file(c, path, profile, errbuf);
    if (rc == LD_ENOENT || (rc == 0 && (!c->access_key[0] || !c->secret_key[0]))) {
        ld_errorf(errbuf, "%s: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
                  "profile '%s' aws_access_key_id and aws_secret_access_key in %s", c->what, profile, path);
        return LD_EACCES;
    }
    return rc;
}

/* ---- the client ---------------------------------------------------------------------- */

static void s3_share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ctx)
{
    (void)h;
    (void)access;
    s3_client *c = ctx;
    pthread_mutex_lock(&c->share_locks[data < CURL_LOCK_DATA_LAST ? data : 0]);
}

static void s3_share_unlock(CURL *h, curl_lock_data data, void *ctx)
{
    (void)h;
    s3_client *c = ctx;
    pthread_mutex_unlock(&c->share_locks[data < CURL_LOCK_DATA_LAST ? data : 0]);
}

static int s3_endpoint(s3_client *c, const struct s3_options *opt, char *errbuf)
{
    char def[128];
    const char *ep = opt->endpoint;
    if (!ep) {
        snprintf(def, sizeof def, "https://s3.%s.amazonaws.com", c->region);
        ep = def;
    }
    const char *sep = strstr(ep, "://");
    size_t slen = sep ? (size_t)(sep - ep) : 0;
    if (!sep || !((slen == 4 && !strncmp(ep, "http", 4)) || (slen == 5 && !strncmp(ep, "https", 5)))) {
        ld_errorf(errbuf, "%s: s3.endpoint '%s': expected http://HOST[:PORT] or https://HOST[:PORT]", c->what, ep);
        return LD_EINVAL;
    }
    memcpy(c->scheme, ep, slen);
    c->scheme[slen] = '\0';
    const char *host = sep + 3;
    size_t hlen = strlen(host);
    while (hlen && host[hlen - 1] == '/')
        hlen--;
    if (hlen == 0 || memchr(host, '/', hlen) || memchr(host, '@', hlen) || memchr(host, '?', hlen)) {
        ld_errorf(errbuf, "%s: s3.endpoint '%s': expected http://HOST[:PORT] or https://HOST[:PORT] (no path, no "
                  "user)", c->what, ep);
        return LD_EINVAL;
    }
    int addressing = opt->addressing;
    if (addressing == S3_ADDRESSING_AUTO)
        addressing = opt->endpoint ? S3_ADDRESSING_PATH : S3_ADDRESSING_VIRTUAL;
    c->path_style = addressing == S3_ADDRESSING_PATH;
    int n = c->path_style ? snprintf(c->host, sizeof c->host, "%.*s", (int)hlen, host)
                          : snprintf(c->host, sizeof c->host, "%s.%.*s", c->bucket, (int)hlen, host);
    if (n < 0 || (size_t)n >= sizeof c->host) {
        ld_errorf(errbuf, "%s: s3.endpoint '%s': host name too long", c->what, ep);
        return LD_EINVAL;
    }
    snprintf(c->describe, sizeof c->describe, "%s://%s (%s, region %s)", c->scheme, c->host,
             c->path_style ? "path-style" : "virtual-hosted", c->region);
    return 0;
}

int s3_client_new(const char *what, const char *bucket, const struct s3_options *opt, s3_client **ret_client,
                  char *errbuf)
{
    pthread_once(&s3_once, s3_global_init);
    if (s3_global_rc != CURLE_OK) {
        ld_errorf(errbuf, "%s: cannot start libcurl: %s", what, curl_easy_strerror(s3_global_rc));
        return LD_EIO;
    }
    s3_client *c = calloc(1, sizeof *c);
    if (!c) {
        ld_errorf(errbuf, "%s: out of memory", what);
        return LD_ENOMEM;
    }
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&c->share_locks[i], NULL);
    pthread_mutex_init(&c->pool_lock, NULL);
    snprintf(c->what, sizeof c->what, "%s", what);
    snprintf(c->bucket, sizeof c->bucket, "%s", bucket);
    const char *region = opt->region;
    if (!region || !*region)
        region = getenv("AWS_REGION");
    if (!region || !*region)
        region = getenv("AWS_DEFAULT_REGION");
    if (!region || !*region)
        region = "us-east-1";
    snprintf(c->region, sizeof c->region, "%s", region);
    c->part_size = opt->part_size ? opt->part_size : S3_DEFAULT_PART;
    c->parallel = opt->parallel ? opt->parallel : S3_DEFAULT_PARALLEL;
    c->retries = opt->retries;
    c->timeout_s = opt->timeout_s ? opt->timeout_s : S3_DEFAULT_TIMEOUT;
    c->connect_timeout_s = opt->connect_timeout_s ? opt->connect_timeout_s : S3_DEFAULT_CONNECT_TIMEOUT;

    int rc = s3_endpoint(c, opt, errbuf);
    if (rc == 0)
        rc = s3_credentials(c, opt, errbuf);
    if (rc == 0 && !(c->share = curl_share_init())) {
        ld_errorf(errbuf, "%s: out of memory", what);
        rc = LD_ENOMEM;
    }
    if (rc == 0) {
        curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, s3_share_lock);
        curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, s3_share_unlock);
        curl_share_setopt(c->share, CURLSHOPT_USERDATA, c);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    }
    if (rc < 0) {
        s3_client_free(c);
        return rc;
    }
    *ret_client = c;
    return 0;
}

void s3_client_free(s3_client *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_pool; i++)
        curl_easy_cleanup(c->pool[i]);
    free(c->pool);
    if (c->share)
        curl_share_cleanup(c->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&c->share_locks[i]);
    pthread_mutex_destroy(&c->pool_lock);
    if (c->session_token) {
        OPENSSL_cleanse(c->session_token, strlen(c->session_token));
        free(c->session_token);
    }
    OPENSSL_cleanse(c->secret_key, sizeof c->secret_key);
    free(c);
}

const char *s3_client_describe(const s3_client *c)
{
    return c->describe;
}

static CURL *s3_handle_take(s3_client *c)
{
    CURL *h = NULL;
    pthread_mutex_lock(&c->pool_lock);
    if (c->n_pool)
        h = c->pool[--c->n_pool];
    pthread_mutex_unlock(&c->pool_lock);
    if (h)
        curl_easy_reset(h);
    else
        h = curl_easy_init();
    return h;
}

static void s3_handle_give(s3_client *c, CURL *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&c->pool_lock);
    if (c->n_pool == c->cap_pool) {
        size_t cap = c->cap_pool ? 2 * c->cap_pool : 16;
        CURL **p = realloc(c->pool, cap * sizeof *p);
        if (p) {
            c->pool = p;
            c->cap_pool = cap;
        }
    }
    if (c->n_pool < c->cap_pool) {
        c->pool[c->n_pool++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&c->pool_lock);
    if (h)
        curl_easy_cleanup(h);
}

/* ---- one request --------------------------------------------------------------------- */

/* What a transfer writes to: the caller's buffer (dst, cap bytes) when the status is
 * 200 or 206, else a small heap buffer for the error document. */
struct s3_sink {
    CURL *h;
    uint8_t *dst;
    uint64_t cap, got;
    long status;
    bool overflow;
    char *body;                     /* error bodies, and list pages (dst == NULL) */
    size_t body_len, body_cap;
};

static size_t s3_sink_write(char *p, size_t size, size_t nmemb, void *ctx)
{
    struct s3_sink *s = ctx;
    size_t n = size * nmemb;
    if (!s->status)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->dst && (s->status == 200 || s->status == 206)) {
        if (n > s->cap - s->got) {
            s->overflow = true;     /* more than asked for: the object is not what was listed */
            return 0;
        }
        memcpy(s->dst + s->got, p, n);
        s->got += n;
        return n;
    }
    size_t max = s->dst ? S3_ERROR_BODY_MAX : S3_LIST_BODY_MAX;
    if (s->body_len + n + 1 > s->body_cap) {
        if (s->body_len + n + 1 > max) {
            if (s->dst)
                return n;           /* an error document's tail is not needed */
            s->overflow = true;
            return 0;
        }
        size_t cap = s->body_cap ? s->body_cap : 4096;
        while (cap < s->body_len + n + 1)
            cap *= 2;
        char *b = realloc(s->body, cap);
        if (!b)
            return 0;
        s->body = b;
        s->body_cap = cap;
    }
    memcpy(s->body + s->body_len, p, n);
    s->body_len += n;
    s->body[s->body_len] = '\0';
    return n;
}

/* The headers of one attempt; kept alive while curl runs it. */
struct s3_prepared {
    struct curl_slist *headers;
    char url[S3_URL_MAX];
};

/* Sets h up for GET of key (NULL: the bucket itself, for a listing) with the given
 * canonical query and an optional range, signed now. */
static int s3_request_prepare(s3_client *c, CURL *h, const char *key, const char *query, const char *range,
                              struct s3_sink *sink, struct s3_prepared *p)
{
    char path[S3_URL_MAX], enc[3 * S3_KEY_MAX + 1], date[32], auth[S3_SIGN_AUTH_MAX], line[S3_SIGN_AUTH_MAX + 64];
    struct s3_sign_header hs[S3_SIGN_MAX_HEADERS];
    size_t nh = 0;

    if (key && s3_sign_uri_encode(key, 1, enc, sizeof enc) < 0)
        return LD_ENAMETOOLONG;
    int n = c->path_style ? snprintf(path, sizeof path, "/%s%s%s", c->bucket, key ? "/" : "", key ? enc : "")
                          : snprintf(path, sizeof path, "/%s", key ? enc : "");
    if (n < 0 || (size_t)n >= sizeof path)
        return LD_ENAMETOOLONG;
    n = snprintf(p->url, sizeof p->url, "%s://%s%s%s%s", c->scheme, c->host, path, *query ? "?" : "", query);
    if (n < 0 || (size_t)n >= sizeof p->url)
        return LD_ENAMETOOLONG;

    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", &tm);

    hs[nh++] = (struct s3_sign_header){"host", c->host};
    hs[nh++] = (struct s3_sign_header){"x-amz-content-sha256", S3_SIGN_EMPTY_SHA256};
    hs[nh++] = (struct s3_sign_header){"x-amz-date", date};
    if (range)
        hs[nh++] = (struct s3_sign_header){"range", range};
    if (c->session_token)
        hs[nh++] = (struct s3_sign_header){"x-amz-security-token", c->session_token};
    struct s3_sign_request r = {
        .method = "GET", .canonical_uri = path, .canonical_query = query, .headers = hs, .n_headers = nh,
        .payload_sha256 = S3_SIGN_EMPTY_SHA256, .amz_date = date, .region = c->region, .service = "s3",
        .access_key = c->access_key, .secret_key = c->secret_key,
    };
    int rc = s3_sign_authorization(&r, auth, sizeof auth);
    if (rc < 0)
        return rc;

    p->headers = NULL;
    for (size_t i = 0; i < nh; i++) {
        snprintf(line, sizeof line, "%s: %s", hs[i].name, hs[i].value);
        struct curl_slist *l = curl_slist_append(p->headers, line);
        if (!l)
            goto nomem;
        p->headers = l;
    }
    snprintf(line, sizeof line, "Authorization: %s", auth);
    struct curl_slist *l = curl_slist_append(p->headers, line);
    OPENSSL_cleanse(line, sizeof line);
    if (!l)
        goto nomem;
    p->headers = l;

    curl_easy_setopt(h, CURLOPT_URL, p->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, p->headers);
    curl_easy_setopt(h, CURLOPT_SHARE, c->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)c->connect_timeout_s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)c->timeout_s);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, s3_sink_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
    curl_easy_setopt(h, CURLOPT_PRIVATE, sink);
    sink->h = h;
    return 0;

nomem:
    curl_slist_free_all(p->headers);
    p->headers = NULL;
    return LD_ENOMEM;
}

/* The text of child element `name` of node (namespaces ignored), or NULL; free with xmlFree. */
static xmlChar *s3_xml_child(const xmlNode *node, const char *name)
{
    for (const xmlNode *n = node ? node->children : NULL; n; n = n->next)
        if (n->type == XML_ELEMENT_NODE && strcmp((const char *)n->name, name) == 0)
            return xmlNodeGetContent(n);
    return NULL;
}

static xmlDoc *s3_xml_read(const char *body, size_t len)
{
    if (!body || !len || len > INT32_MAX)
        return NULL;
    return xmlReadMemory(body, (int)len, "s3.xml", NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
}

/* " SignatureDoesNotMatch (The request signature ...)" from an error document, or "". */
static void s3_error_code(const char *body, size_t len, char *out, size_t cap)
{
    out[0] = '\0';
    xmlDoc *doc = s3_xml_read(body, len);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (root && strcmp((const char *)root->name, "Error") == 0) {
        xmlChar *code = s3_xml_child(root, "Code"), *msg = s3_xml_child(root, "Message");
        if (code)
            snprintf(out, cap, " %s%s%.200s%s", (const char *)code, msg ? " (" : "", msg ? (const char *)msg : "",
                     msg ? ")" : "");
        xmlFree(code);
        xmlFree(msg);
    }
    xmlFreeDoc(doc);
}

static bool s3_retryable(CURLcode cc, long status)
{
    if (cc == CURLE_OK)
        return status >= 500 || status == 429 || status == 408;
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_OPERATION_TIMEDOUT ||
           cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR || cc == CURLE_PARTIAL_FILE || cc == CURLE_GOT_NOTHING ||
           cc == CURLE_SSL_CONNECT_ERROR;
}

/* Milliseconds before attempt `attempt` (1 for the first retry): 100 ms doubling to
 * 5 s, each with up to half again of jitter so that many readers do not retry in step. */
static uint64_t s3_backoff_ms(uint32_t attempt, unsigned *seed)
{
    uint64_t ms = S3_BACKOFF_FIRST_MS;
    for (uint32_t i = 1; i < attempt && ms < S3_BACKOFF_MAX_MS; i++)
        ms *= 2;
    if (ms > S3_BACKOFF_MAX_MS)
        ms = S3_BACKOFF_MAX_MS;
    return ms + (uint64_t)rand_r(seed) % (ms / 2 + 1);
}

static uint64_t s3_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The code and message for a finished attempt that failed. */
static int s3_failure(const s3_client *c, const char *key, CURLcode cc, const struct s3_sink *s, const char *op,
                      uint32_t attempts, char *errbuf)
{
    char code[300];
    if (cc != CURLE_OK && cc != CURLE_WRITE_ERROR) {
        ld_errorf(errbuf, "s3://%s/%s: %s from %s://%s failed after %" PRIu32 " attempt%s: %s", c->bucket,
                  key ? key : "", op, c->scheme, c->host, attempts, attempts == 1 ? "" : "s", curl_easy_strerror(cc));
        return cc == CURLE_OPERATION_TIMEDOUT ? LD_ETIMEDOUT : LD_EDATASET;
    }
    if (s->overflow) {
        ld_errorf(errbuf, "s3://%s/%s: %s: the answer is longer than the %" PRIu64 " bytes asked for (the object "
                  "changed since it was listed)", c->bucket, key ? key : "", op, s->cap);
        return LD_ESAMPLE;
    }
    s3_error_code(s->body, s->body_len, code, sizeof code);
    ld_errorf(errbuf, "s3://%s/%s: %s: HTTP %ld%s%s", c->bucket, key ? key : "", op, s->status, code,
              attempts > 1 ? " (after retries)" : "");
    if (s->status == 404)
        return strstr(code, "NoSuchBucket") ? LD_ENOENT : LD_ESAMPLE;
    if (s->status == 416)
        return LD_ESAMPLE;          /* the range is past the end: the object shrank */
    if (s->status == 401 || s->status == 403)
        return LD_EACCES;
    return LD_EDATASET;
}

/* ---- listing ------------------------------------------------------------------------- */

/* One page's objects to fn; the continuation token (or "" on the last page) into next. */
static int s3_list_page(s3_client *c, const char *body, size_t len, s3_list_fn fn, void *ctx, char *next,
                        size_t next_cap, char *errbuf)
{
    xmlDoc *doc = s3_xml_read(body, len);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    int rc = 0;
    next[0] = '\0';
    if (!root || strcmp((const char *)root->name, "ListBucketResult") != 0) {
        ld_errorf(errbuf, "s3://%s: the listing is not a ListBucketResult document", c->bucket);
        rc = LD_EDATASET;
        goto out;
    }
    for (const xmlNode *n = root->children; n && rc == 0; n = n->next) {
        if (n->type != XML_ELEMENT_NODE || strcmp((const char *)n->name, "Contents") != 0)
            continue;
        xmlChar *key = s3_xml_child(n, "Key"), *size = s3_xml_child(n, "Size");
        xmlChar *etag = s3_xml_child(n, "ETag"), *mod = s3_xml_child(n, "LastModified");
        char *end = NULL;
        unsigned long long sz = size ? strtoull((const char *)size, &end, 10) : 0;
        if (!key || !size || end == (char *)size || *end) {
            ld_errorf(errbuf, "s3://%s: the listing has an object without a Key or a Size", c->bucket);
            rc = LD_EDATASET;
        } else {
            rc = fn(ctx, (const char *)key, (uint64_t)sz, etag ? (const char *)etag : "",
                    mod ? (const char *)mod : "");
        }
        xmlFree(key);
        xmlFree(size);
        xmlFree(etag);
        xmlFree(mod);
    }
    if (rc == 0) {
        xmlChar *trunc = s3_xml_child(root, "IsTruncated"), *token = s3_xml_child(root, "NextContinuationToken");
        if (trunc && strcmp((const char *)trunc, "true") == 0) {
            if (!token || !*token || strlen((const char *)token) >= next_cap) {
                ld_errorf(errbuf, "s3://%s: a truncated listing without a usable NextContinuationToken", c->bucket);
                rc = LD_EDATASET;
            } else {
                snprintf(next, next_cap, "%s", (const char *)token);
            }
        }
        xmlFree(trunc);
        xmlFree(token);
    }
out:
    xmlFreeDoc(doc);
    return rc;
}

int s3_list(s3_client *c, const char *prefix, s3_list_fn fn, void *ctx, char *errbuf)
{
    char token[2048] = "", enc_token[3 * sizeof token], enc_prefix[3 * S3_KEY_MAX + 1], query[sizeof enc_token + 4096];
    unsigned seed = (unsigned)s3_now_ms();
    int rc = 0;

    if (s3_sign_uri_encode(prefix, 0, enc_prefix, sizeof enc_prefix) < 0) {
        ld_errorf(errbuf, "s3://%s/%s: prefix too long", c->bucket, prefix);
        return LD_ENAMETOOLONG;
    }
    do {
        /* The canonical query lists its parameters sorted by name. */
        if (token[0]) {
            s3_sign_uri_encode(token, 0, enc_token, sizeof enc_token);
            snprintf(query, sizeof query, "continuation-token=%s&list-type=2&prefix=%s", enc_token, enc_prefix);
        } else {
            snprintf(query, sizeof query, "list-type=2&prefix=%s", enc_prefix);
        }
        struct s3_sink sink = {0};
        CURLcode cc = CURLE_OK;
        uint32_t attempt = 0;
        for (;;) {
            struct s3_prepared p;
            CURL *h = s3_handle_take(c);
            free(sink.body);
            sink = (struct s3_sink){0};
            if (!h || (rc = s3_request_prepare(c, h, NULL, query, NULL, &sink, &p)) < 0) {
                s3_handle_give(c, h);
                ld_errorf(errbuf, "%s: out of memory", c->what);
                return LD_ENOMEM;
            }
            cc = curl_easy_perform(h);
            if (!sink.status)
                curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &sink.status);
            curl_slist_free_all(p.headers);
            s3_handle_give(c, h);
            attempt++;
            if (!s3_retryable(cc, sink.status) || attempt > c->retries)
                break;
            struct timespec ts = {0};
            uint64_t ms = s3_backoff_ms(attempt, &seed);
            ts.tv_sec = (time_t)(ms / 1000);
            ts.tv_nsec = (long)(ms % 1000) * 1000000L;
            nanosleep(&ts, NULL);
        }
        if (cc != CURLE_OK || sink.status != 200 || sink.overflow) {
            rc = s3_failure(c, prefix, cc, &sink, "list", attempt, errbuf);
            if (rc == LD_ESAMPLE)
                rc = LD_EDATASET;
        } else {
            rc = s3_list_page(c, sink.body, sink.body_len, fn, ctx, token, sizeof token, errbuf);
        }
        free(sink.body);
    } while (rc == 0 && token[0]);
    return rc;
}

/* ---- reads --------------------------------------------------------------------------- */

enum s3_part_state {
    S3_PART_WAITING = 0,            /* not started, or waiting for its retry */
    S3_PART_RUNNING = 1,            /* on the multi handle */
    S3_PART_DONE = 2,               /* settled: read, or its read failed */
};

struct s3_part {
    struct s3_get *get;
    uint64_t off, len;              /* within the object */
    struct s3_sink sink;
    struct s3_prepared prep;
    uint32_t attempts;
    uint64_t not_before_ms;
    int state;                      /* enum s3_part_state */
};

static void s3_part_end(s3_client *c, struct s3_part *p, int state)
{
    curl_slist_free_all(p->prep.headers);
    p->prep.headers = NULL;
    s3_handle_give(c, p->sink.h);
    p->sink.h = NULL;
    free(p->sink.body);
    p->sink.body = NULL;
    p->sink.body_len = p->sink.body_cap = 0;
    p->state = state;
}

static int s3_part_start(s3_client *c, CURLM *m, struct s3_part *p)
{
    char range[64];
    CURL *h = s3_handle_take(c);
    if (!h)
        return LD_ENOMEM;
    p->sink = (struct s3_sink){.dst = (uint8_t *)p->get->dst + (p->off - p->get->offset), .cap = p->len};
    snprintf(range, sizeof range, "bytes=%" PRIu64 "-%" PRIu64, p->off, p->off + p->len - 1);
    int rc = s3_request_prepare(c, h, p->get->key, "", range, &p->sink, &p->prep);
    if (rc == 0 && curl_multi_add_handle(m, h) != CURLM_OK)
        rc = LD_ENOMEM;
    if (rc < 0) {
        p->sink.h = h;
        s3_part_end(c, p, S3_PART_DONE);
        return rc;
    }
    p->attempts++;
    p->state = S3_PART_RUNNING;
    return 0;
}

/* A finished transfer: the part is read, failed for good, or waits for its retry. */
static void s3_part_settle(s3_client *c, struct s3_part *p, CURLcode cc, unsigned *seed)
{
    struct s3_sink *s = &p->sink;
    if (!s->status)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    bool ok = cc == CURLE_OK && (s->status == 206 || (s->status == 200 && p->off == 0)) && !s->overflow;
    if (ok && s->got != p->len) {
        if (p->get->rc == 0) {
            ld_errorf(p->get->errmsg, "s3://%s/%s: expected %" PRIu64 " bytes from offset %" PRIu64 ", got %" PRIu64
                      " (the object changed since it was listed)", c->bucket, p->get->key, p->len, p->off, s->got);
            p->get->rc = LD_ESAMPLE;
        }
    } else if (!ok && s3_retryable(cc, s->status) && p->attempts <= c->retries) {
        p->not_before_ms = s3_now_ms() + s3_backoff_ms(p->attempts, seed);
        s3_part_end(c, p, S3_PART_WAITING);
        return;
    } else if (!ok && p->get->rc == 0) {
        p->get->rc = s3_failure(c, p->get->key, cc, s, "GET", p->attempts, p->get->errmsg);
        if (p->get->rc == LD_ENOENT)
            p->get->rc = LD_EDATASET;   /* the bucket is gone: no sample can be read */
    }
    s3_part_end(c, p, S3_PART_DONE);
}

int s3_get_many(s3_client *c, struct s3_get *gets, size_t n)
{
    struct s3_part *parts = NULL;
    size_t n_parts = 0, running = 0;
    unsigned seed = (unsigned)(s3_now_ms() ^ (uintptr_t)gets);
    CURLM *m = NULL;
    int first_rc = 0;

    for (size_t i = 0; i < n; i++) {
        gets[i].rc = 0;
        n_parts += (size_t)((gets[i].len + c->part_size - 1) / c->part_size);
    }
    parts = calloc(n_parts ? n_parts : 1, sizeof *parts);
    m = curl_multi_init();
    if (!parts || !m) {
        for (size_t i = 0; i < n; i++) {
            gets[i].rc = LD_ENOMEM;
            ld_errorf(gets[i].errmsg, "%s: out of memory", c->what);
        }
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t off = 0; off < gets[i].len; off += c->part_size) {
            uint64_t len = gets[i].len - off < c->part_size ? gets[i].len - off : c->part_size;
            parts[k++] = (struct s3_part){.get = &gets[i], .off = gets[i].offset + off, .len = len};
        }

    /* Every round starts the waiting parts that may start (in order, up to `parallel`
     * in flight), lets curl work for up to 100 ms, then settles what finished. */
    for (;;) {
        uint64_t now = s3_now_ms(), wake = UINT64_MAX;
        size_t pending = 0;
        for (size_t i = 0; i < n_parts; i++) {
            struct s3_part *p = &parts[i];
            if (p->state == S3_PART_WAITING && p->get->rc < 0)
                p->state = S3_PART_DONE;    /* another part of its read failed */
            if (p->state == S3_PART_DONE)
                continue;
            pending++;
            if (p->state == S3_PART_RUNNING || running >= c->parallel)
                continue;
            if (p->not_before_ms > now) {
                wake = p->not_before_ms < wake ? p->not_before_ms : wake;
                continue;
            }
            int rc = s3_part_start(c, m, p);
            if (rc < 0) {
                if (p->get->rc == 0) {
                    p->get->rc = rc;
                    ld_errorf(p->get->errmsg, "s3://%s/%s: cannot start the request: %s", c->bucket, p->get->key,
                              ld_strerror(rc));
                }
                pending--;
                continue;
            }
            running++;
        }
        if (pending == 0)
            break;

        int still = 0, wait_ms = 100;
        if (wake != UINT64_MAX && wake - now < (uint64_t)wait_ms)
            wait_ms = (int)(wake - now);
        curl_multi_perform(m, &still);
        curl_multi_poll(m, NULL, 0, wait_ms, NULL);
        curl_multi_perform(m, &still);

        CURLMsg *msg;
        int queued;
        while ((msg = curl_multi_info_read(m, &queued))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            CURL *h = msg->easy_handle;
            CURLcode cc = msg->data.result;
            char *priv = NULL;
            curl_easy_getinfo(h, CURLINFO_PRIVATE, &priv);
            struct s3_part *p = (struct s3_part *)(priv - offsetof(struct s3_part, sink));
            curl_multi_remove_handle(m, h);
            running--;
            s3_part_settle(c, p, cc, &seed);
        }
    }

out:
    for (size_t i = 0; parts && i < n_parts; i++)
        if (parts[i].state == S3_PART_RUNNING) {
            curl_multi_remove_handle(m, parts[i].sink.h);
            s3_part_end(c, &parts[i], S3_PART_DONE);
        }
    if (m)
        curl_multi_cleanup(m);
    free(parts);
    for (size_t i = 0; i < n && first_rc == 0; i++)
        first_rc = gets[i].rc;
    return first_rc;
}
