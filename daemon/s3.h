/* s3 — a small client for S3-compatible object stores: the key list of a prefix and
 * ranged reads of objects, over libcurl, signed with SigV4 (s3_sign.h).
 *
 * One client serves one bucket of one dataset and is shared by every thread that reads
 * it: connections, DNS answers and TLS sessions are pooled across threads (a curl share
 * object), so a worker's GET reuses a connection another worker opened. A read is a set
 * of ranged GETs run together on one curl multi handle: an object larger than the part
 * size is read in parts in parallel, and several objects may be asked for at once (the
 * cache build reads ahead this way). Each part is retried with a growing, jittered
 * delay when the store answers 5xx or 429 or the transfer fails (connection refused,
 * reset, timed out), up to the configured count.
 *
 * Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN) or the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
 * ~/.aws/credentials; the profile from the config, AWS_PROFILE, else "default"). They
 * are kept in the client only; no message, log line or report ever shows one. */
#ifndef LD_S3_H
#define LD_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* s3.addressing: where the bucket goes in a request's URL. */
enum s3_addressing {
    S3_ADDRESSING_AUTO = 0,         /* virtual on AWS's own endpoint, path on any other */
    S3_ADDRESSING_PATH = 1,         /* http://endpoint/bucket/key (MinIO, Ceph, test servers) */
    S3_ADDRESSING_VIRTUAL = 2,      /* http://bucket.endpoint/key */
};

struct s3_options {
    const char *endpoint;           /* "http://127.0.0.1:9000"; NULL: https://s3.REGION.amazonaws.com */
    const char *region;             /* NULL: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1 */
    int addressing;                 /* enum s3_addressing */
    const char *profile;            /* NULL: $AWS_PROFILE, else "default" (credentials file only) */
    const char *credentials_file;   /* NULL: $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials */
    uint64_t part_size;             /* bytes of one ranged GET; 0: 8 MiB */
    uint32_t parallel;              /* GETs in flight per read; 0: 16 */
    uint32_t retries;               /* attempts after the first; the default is the caller's */
    uint32_t timeout_s;             /* one attempt's limit; 0: 30 */
    uint32_t connect_timeout_s;     /* 0: 10 */
};

typedef struct s3_client s3_client;

/* True for "s3://...". */
bool s3_is_url(const char *path);
/* Splits "s3://bucket/prefix" into the bucket (into bucket, cap bytes) and the prefix
 * (a pointer into url; "" for none; a trailing '/' is kept). LD_EINVAL with the reason
 * in errbuf for a URL without a valid bucket name. */
int s3_url_split(const char *url, char *bucket, size_t cap, const char **ret_prefix, char *errbuf);

/* Resolves the options (endpoint, region, credentials) for `bucket`. `what` names the
 * owner in messages ("dataset 'x'"). Blocking (reads the credentials file); no request
 * is sent. LD_EINVAL for a bad endpoint, LD_EACCES when no credentials are found
 * (errbuf says where it looked), LD_ENOMEM. */
int s3_client_new(const char *what, const char *bucket, const struct s3_options *opt, s3_client **ret_client,
                  char *errbuf);
/* Frees the client and its pooled connections. Accepts NULL. No read may be running. */
void s3_client_free(s3_client *c);
/* "http://127.0.0.1:9000 (path-style, region us-east-1)", for logs. Never a credential. */
const char *s3_client_describe(const s3_client *c);

/* Called once per object of a listing, in the store's (byte-wise) key order. etag is
 * the quoted ETag as the store gave it, last_modified its ISO 8601 text. A non-zero
 * return stops the listing and is returned by s3_list. */
typedef int (*s3_list_fn)(void *ctx, const char *key, uint64_t size, const char *etag, const char *last_modified);

/* Lists every object whose key starts with prefix (ListObjectsV2, page after page).
 * Blocking. On failure: LD_ENOENT (NoSuchBucket), LD_EACCES (403: bad credentials or
 * no permission), LD_EDATASET (the store cannot be reached after the retries, or an
 * answer that cannot be read), with errbuf naming the bucket, the HTTP status and S3's
 * error code and message. */
int s3_list(s3_client *c, const char *prefix, s3_list_fn fn, void *ctx, char *errbuf);

/* One ranged read: len bytes of `key` from `offset` into dst (len > 0). rc and errmsg
 * are the outcome (errmsg: LD_ERRMSG_MAX bytes, or NULL). */
struct s3_get {
    const char *key;
    uint64_t offset, len;
    void *dst;
    int rc;
    char *errmsg;
};

/* Runs the n reads together (up to `parallel` GETs in flight; each read cut into parts
 * of part_size), retrying as described at the top. Blocking; any thread, concurrently.
 * Returns 0 when every read succeeded, else the first failed read's rc; each read's own
 * outcome is in its rc: LD_ESAMPLE (the object is missing, or shorter than asked:
 * changed since it was listed), LD_EDATASET (403, or the store unreachable after the
 * retries), LD_ETIMEDOUT (the last attempt timed out), LD_ENOMEM. Messages name
 * s3://bucket/key, the HTTP status and S3's error code. */
int s3_get_many(s3_client *c, struct s3_get *gets, size_t n);

#endif
