/* s3_sign — AWS Signature Version 4 for the object store client (s3.c).
 *
 * A request is signed by hashing its canonical form (method, path, query, the headers
 * it names, the payload's SHA-256) and keying an HMAC-SHA256 chain with the secret, the
 * date, the region and the service. The caller builds the canonical path and query with
 * s3_sign_uri_encode (S3 encodes each path segment once and keeps its '/'); the signer
 * sorts the headers, lower-cases nothing (names must already be lower case) and writes
 * the Authorization header's value. Pure functions over OpenSSL's libcrypto, any thread;
 * they never log, so a secret never reaches a message. */
#ifndef LD_S3_SIGN_H
#define LD_S3_SIGN_H

#include <stddef.h>

/* The SHA-256 of an empty payload, in hex: what a GET or a LIST signs. */
#define S3_SIGN_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/* Room for an Authorization value: the credential scope, the signed header names, the
 * 64-digit signature. */
#define S3_SIGN_AUTH_MAX 1024
#define S3_SIGN_MAX_HEADERS 8

struct s3_sign_header {
    const char *name;               /* lower case: "host", "range", "x-amz-date" */
    const char *value;              /* trimmed */
};

struct s3_sign_request {
    const char *method;             /* "GET" */
    const char *canonical_uri;      /* the encoded path: "/bucket/dir/a%20b.bin" */
    const char *canonical_query;    /* encoded pairs sorted by name, "&"-joined; "" for none */
    const struct s3_sign_header *headers;   /* at most S3_SIGN_MAX_HEADERS, any order */
    size_t n_headers;
    const char *payload_sha256;     /* hex, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;           /* "20150830T123600Z": also an x-amz-date header's value */
    const char *region;             /* "us-east-1" */
    const char *service;            /* "s3" */
    const char *access_key;
    const char *secret_key;
};

/* Writes "AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=a;b, Signature=HEX" into out (cap bytes, S3_SIGN_AUTH_MAX is enough for
 * keys of up to 128 bytes). LD_EINVAL for too many headers or an amz_date that is not 16
 * characters; LD_ERANGE when out is too small; LD_ENOMEM; LD_EIO when libcrypto fails. */
int s3_sign_authorization(const struct s3_sign_request *r, char *out, size_t cap);

/* Percent-encodes s into out (cap bytes, NUL-terminated) as SigV4 wants: A-Z a-z 0-9
 * - . _ ~ stay, '/' stays when keep_slash, every other byte becomes %XX (upper-case hex).
 * Returns the length, or LD_ERANGE when out is too small. */
int s3_sign_uri_encode(const char *s, int keep_slash, char *out, size_t cap);

/* The hex SHA-256 of len bytes (65 bytes of out). 0 or LD_EIO. */
int s3_sign_sha256_hex(const void *data, size_t len, char out[65]);

#endif
