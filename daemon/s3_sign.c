/* s3_sign — AWS Signature Version 4: the canonical request, the string to sign, the
 * derived key and the Authorization header (see s3_sign.h). The hashes and HMACs are
 * OpenSSL's (EVP_Digest, HMAC); the unit test checks the result against AWS's
 * published examples (test_s3.c). */
#include "s3_sign.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "ld_error.h"

static void s3_sign_hex(const unsigned char *in, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * len] = '\0';
}

int s3_sign_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL) != 1 || md_len != 32)
        return LD_EIO;
    s3_sign_hex(md, 32, out);
    return 0;
}

static int s3_sign_hmac(const void *key, size_t key_len, const char *msg, unsigned char out[32])
{
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out, &len) || len != 32)
        return LD_EIO;
    return 0;
}

int s3_sign_uri_encode(const char *s, int keep_slash, char *out, size_t cap)
{
    static const char digits[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                     c == '.' || c == '_' || c == '~' || (c == '/' && keep_slash);
        if (n + (plain ? 1 : 3) >= cap)
            return LD_ERANGE;
        if (plain) {
            out[n++] = (char)c;
        } else {
            out[n++] = '%';
            out[n++] = digits[c >> 4];
            out[n++] = digits[c & 15];
        }
    }
    if (n >= cap)
        return LD_ERANGE;
    out[n] = '\0';
    return (int)n;
}

static int s3_sign_header_cmp(const void *a, const void *b)
{
    return strcmp(((const struct s3_sign_header *)a)->name, ((const struct s3_sign_header *)b)->name);
}

int s3_sign_authorization(const struct s3_sign_request *r, char *out, size_t cap)
{
    struct s3_sign_header h[S3_SIGN_MAX_HEADERS];
    char *canon = NULL, signed_names[512], date[9], scope[256], digest[65], string_to_sign[512], sig[65];
    size_t canon_len = 0, names_len = 0;
    unsigned char k[32], k2[32];
    int rc = 0;

    if (r->n_headers > S3_SIGN_MAX_HEADERS || strlen(r->amz_date) != 16)
        return LD_EINVAL;
    memcpy(h, r->headers, r->n_headers * sizeof *h);
    qsort(h, r->n_headers, sizeof *h, s3_sign_header_cmp);

    signed_names[0] = '\0';
    for (size_t i = 0; i < r->n_headers; i++) {
        int n = snprintf(signed_names + names_len, sizeof signed_names - names_len, "%s%s", i ? ";" : "", h[i].name);
        if (n < 0 || (size_t)n >= sizeof signed_names - names_len)
            return LD_ERANGE;
        names_len += (size_t)n;
    }

    /* The canonical request: method, path, query, "name:value\n" per header, a blank
     * line's worth of separator, the signed names, the payload's hash. */
    FILE *f = open_memstream(&canon, &canon_len);
    if (!f)
        return LD_ENOMEM;
    fprintf(f, "%s\n%s\n%s\n", r->method, r->canonical_uri, r->canonical_query);
    for (size_t i = 0; i < r->n_headers; i++)
        fprintf(f, "%s:%s\n", h[i].name, h[i].value);
    fprintf(f, "\n%s\n%s", signed_names, r->payload_sha256);
    if (fclose(f) != 0 || !canon) {
        free(canon);
        return LD_ENOMEM;
    }
    rc = s3_sign_sha256_hex(canon, canon_len, digest);
    free(canon);
    if (rc < 0)
        return rc;

    memcpy(date, r->amz_date, 8);
    date[8] = '\0';
    int n = snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", date, r->region, r->service);
    if (n < 0 || (size_t)n >= sizeof scope)
        return LD_ERANGE;
    n = snprintf(string_to_sign, sizeof string_to_sign, "AWS4-HMAC-SHA256\n%s\n%s\n%s", r->amz_date, scope, digest);
    if (n < 0 || (size_t)n >= sizeof string_to_sign)
        return LD_ERANGE;

    /* The key: HMAC("AWS4" + secret, date), then the region, the service, "aws4_request". */
    size_t slen = strlen(r->secret_key);
    char *first = malloc(slen + 5);
    if (!first)
        return LD_ENOMEM;
    memcpy(first, "AWS4", 4);
    memcpy(first + 4, r->secret_key, slen + 1);
    rc = s3_sign_hmac(first, slen + 4, date, k);
    OPENSSL_cleanse(first, slen + 4);
    free(first);
    if (rc == 0)
        rc = s3_sign_hmac(k, 32, r->region, k2);
    if (rc == 0)
        rc = s3_sign_hmac(k2, 32, r->service, k);
    if (rc == 0)
        rc = s3_sign_hmac(k, 32, "aws4_request", k2);
    if (rc == 0)
        rc = s3_sign_hmac(k2, 32, string_to_sign, k);
    if (rc == 0)
        s3_sign_hex(k, 32, sig);
    OPENSSL_cleanse(k2, sizeof k2);
    OPENSSL_cleanse(k, sizeof k);
    if (rc < 0)
        return rc;

    n = snprintf(out, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", r->access_key,
                 scope, signed_names, sig);
    if (n < 0 || (size_t)n >= cap)
        return LD_ERANGE;
    return 0;
}
