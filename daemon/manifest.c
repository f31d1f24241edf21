/* manifest — reads a CSV or JSONL sample list (manifest.h).
 *
 * The file is read whole into memory (it is small next to the data it lists) and
 * scanned once. Each kept cell is copied, unquoted, into one arena of NUL-terminated
 * strings; a row is n_columns offsets into it (its line number is kept as runs). The scanners count
 * lines as they go, including the line breaks inside quoted CSV fields, so that the
 * line a message names is the one an editor shows. Nothing here trusts the file: every
 * row is checked against the header (CSV) or for each declared key (JSONL), and the
 * first bad row stops the read with its line. */
#include "manifest.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena.h"
#include "ld_error.h"
#include "proto.h"

struct manifest {
    char *path;
    size_t n_columns;
    size_t rows, cap_rows;
    uint64_t *cells;                /* rows * n_columns arena offsets */
    /* Each row's line, as runs: row r of a run starting at (row, line) is on line
     * line + (r - row). A plain CSV or JSONL file is one run; each blank line or quoted
     * line break starts another. So a row costs only its cells (bench_scale.py). */
    struct manifest_line_run {
        uint64_t row, line;
    } *runs;
    size_t n_runs, cap_runs;
    char *arena;
    size_t arena_len, arena_cap;
    uint64_t hash;
};

/* One scan: the file's bytes and where we are. */
struct manifest_scan {
    manifest *m;
    const char *p, *end;
    uint64_t line;
    char *errbuf;
};

static int manifest_push(manifest *m, const char *s, size_t len, uint64_t *ret_off)
{
    return arena_push(&m->arena, &m->arena_len, &m->arena_cap, s, len, ret_off);
}

/* Starts row `m->rows` at `line`; its cells are set by the caller. */
static int manifest_add_row(manifest *m, uint64_t line)
{
    size_t row_bytes = (m->n_columns ? m->n_columns : 1) * sizeof *m->cells;
    if (arena_grow((void **)&m->cells, &m->cap_rows, m->rows + 1, row_bytes) < 0)
        return LD_ENOMEM;
    const struct manifest_line_run *last = m->n_runs ? &m->runs[m->n_runs - 1] : NULL;
    if (!last || last->line + (m->rows - last->row) != line) {
        if (arena_grow((void **)&m->runs, &m->cap_runs, m->n_runs + 1, sizeof *m->runs) < 0)
            return LD_ENOMEM;
        m->runs[m->n_runs++] = (struct manifest_line_run){.row = m->rows, .line = line};
    }
    m->rows++;
    return 0;
}

static int scan_fail(struct manifest_scan *s, uint64_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int scan_fail(struct manifest_scan *s, uint64_t line, const char *fmt, ...)
{
    char msg[LD_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ld_errorf(s->errbuf, "%s:%" PRIu64 ": %s", s->m->path, line, msg);
    return LD_EDATASET;
}

static int scan_oom(struct manifest_scan *s)
{
    ld_errorf(s->errbuf, "%s: out of memory", s->m->path);
    return LD_ENOMEM;
}

/* ---- CSV ------------------------------------------------------------------------ */

/* The fields of one record, unquoted, back to back in buf (each NUL-terminated). */
struct csv_record {
    char *buf;
    size_t len, cap;
    size_t *starts;
    size_t n, cap_starts;
    uint64_t line;                  /* where the record starts */
};

static int csv_put(struct csv_record *r, char c)
{
    if (arena_grow((void **)&r->buf, &r->cap, r->len + 1, 1) < 0)
        return LD_ENOMEM;
    r->buf[r->len++] = c;
    return 0;
}

/* Reads one record at s->p; *ret_blank when the line was empty. */
static int csv_record(struct manifest_scan *s, struct csv_record *r, bool *ret_blank)
{
    r->len = r->n = 0;
    r->line = s->line;
    *ret_blank = s->p < s->end && (*s->p == '\n' || (*s->p == '\r' && s->p + 1 < s->end && s->p[1] == '\n'));
    for (;;) {
        if (arena_grow((void **)&r->starts, &r->cap_starts, r->n + 1, sizeof *r->starts) < 0)
            return scan_oom(s);
        r->starts[r->n++] = r->len;
        if (s->p < s->end && *s->p == '"') {
            uint64_t opened = s->line;
            s->p++;
            for (;;) {
                if (s->p >= s->end)
                    return scan_fail(s, opened, "a quoted field is never closed");
                char c = *s->p++;
                if (c == '"') {
                    if (s->p < s->end && *s->p == '"') {
                        s->p++;
                    } else {
                        break;
                    }
                } else if (c == '\n') {
                    s->line++;
                }
                if (csv_put(r, c) < 0)
                    return scan_oom(s);
            }
            if (s->p < s->end && *s->p != ',' && *s->p != '\n' &&
                !(*s->p == '\r' && s->p + 1 < s->end && s->p[1] == '\n'))
                return scan_fail(s, s->line, "field %zu: text after its closing quote", r->n);
        } else {
            while (s->p < s->end && *s->p != ',' && *s->p != '\n' &&
                   !(*s->p == '\r' && s->p + 1 < s->end && s->p[1] == '\n')) {
                if (*s->p == '\0')
                    return scan_fail(s, s->line, "a NUL byte: not a text file");
                if (csv_put(r, *s->p++) < 0)
                    return scan_oom(s);
            }
        }
        if (csv_put(r, '\0') < 0)
            return scan_oom(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        /* Here s->p is at a line break (LF or CRLF) or the end: a record ends a line. */
        if (s->p < s->end && *s->p == '\r')
            s->p++;
        if (s->p < s->end && *s->p == '\n') {
            s->p++;
            s->line++;
        }
        return 0;
    }
}

static int csv_read(struct manifest_scan *s, const char *const columns[], size_t n_columns)
{
    struct csv_record r = {0};
    size_t *index = calloc(n_columns ? n_columns : 1, sizeof *index);
    size_t n_header = 0;
    bool blank;
    int ret = 0;

    if (!index) {
        ret = scan_oom(s);
        goto out;
    }
    if (s->end - s->p >= 3 && memcmp(s->p, "\xef\xbb\xbf", 3) == 0)
        s->p += 3;
    while (s->p < s->end) {             /* the header: the first line that is not blank */
        if ((ret = csv_record(s, &r, &blank)) < 0)
            goto out;
        if (!blank)
            break;
    }
    if (r.n == 0 || blank) {
        ret = scan_fail(s, 1, "empty: a CSV manifest starts with a header row naming its columns");
        goto out;
    }
    n_header = r.n;
    for (size_t c = 0; c < n_columns; c++) {
        size_t found = SIZE_MAX;
        for (size_t k = 0; k < r.n; k++) {
            if (strcmp(r.buf + r.starts[k], columns[c]) != 0)
                continue;
            if (found != SIZE_MAX) {
                ret = scan_fail(s, r.line, "the header names column '%s' twice", columns[c]);
                goto out;
            }
            found = k;
        }
        if (found == SIZE_MAX) {
            char have[256] = "";
            for (size_t k = 0; k < r.n && strlen(have) + 8 < sizeof have; k++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s'%.60s'", k ? ", " : "",
                         r.buf + r.starts[k]);
            ret = scan_fail(s, r.line, "the header has no column '%s' (it has %s)", columns[c], have);
            goto out;
        }
        index[c] = found;
    }
    while (s->p < s->end) {
        if ((ret = csv_record(s, &r, &blank)) < 0)
            goto out;
        if (blank)
            continue;
        if (r.n != n_header) {
            ret = scan_fail(s, r.line, "%zu fields, the header has %zu", r.n, n_header);
            goto out;
        }
        if (manifest_add_row(s->m, r.line) < 0) {
            ret = scan_oom(s);
            goto out;
        }
        uint64_t *cells = s->m->cells + (s->m->rows - 1) * n_columns;
        for (size_t c = 0; c < n_columns; c++) {
            const char *v = r.buf + r.starts[index[c]];
            if (manifest_push(s->m, v, strlen(v), &cells[c]) < 0) {
                ret = scan_oom(s);
                goto out;
            }
        }
    }
out:
    free(r.buf);
    free(r.starts);
    free(index);
    return ret;
}

/* ---- JSONL ---------------------------------------------------------------------- */

static int jsonl_read(struct manifest_scan *s, const char *const columns[], size_t n_columns)
{
    while (s->p < s->end) {
        const char *eol = memchr(s->p, '\n', (size_t)(s->end - s->p));
        const char *line = s->p, *stop = eol ? eol : s->end;
        uint64_t at = s->line;
        s->p = eol ? eol + 1 : s->end;
        s->line++;
        const char *q = line;
        while (q < stop && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        if (q == stop)
            continue;
        if (memchr(line, '\0', (size_t)(stop - line)))
            return scan_fail(s, at, "a NUL byte: not a text file");
        const char *end = NULL;
        cJSON *obj = cJSON_ParseWithLengthOpts(line, (size_t)(stop - line), &end, false);
        if (!obj) {
            size_t col = end && end >= line && end <= stop ? (size_t)(end - line) + 1 : 0;
            return scan_fail(s, at, "not valid JSON (near column %zu)", col);
        }
        while (end && end < stop && (*end == ' ' || *end == '\t' || *end == '\r'))
            end++;
        int ret = 0;
        if (end != stop) {
            ret = scan_fail(s, at, "text after the JSON object");
        } else if (!cJSON_IsObject(obj)) {
            ret = scan_fail(s, at, "expected a JSON object with the columns as keys");
        } else if (manifest_add_row(s->m, at) < 0) {
            ret = scan_oom(s);
        }
        uint64_t *cells = ret ? NULL : s->m->cells + (s->m->rows - 1) * n_columns;
        for (size_t c = 0; !ret && c < n_columns; c++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, columns[c]);
            char num[64];
            const char *text = NULL;
            if (cJSON_IsString(v)) {
                text = v->valuestring;
            } else if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
                double d = v->valuedouble;
                if (d == floor(d) && fabs(d) < 9007199254740992.0)
                    snprintf(num, sizeof num, "%lld", (long long)d);
                else
                    snprintf(num, sizeof num, "%.9g", d);
                text = num;
            } else if (!v) {
                ret = scan_fail(s, at, "no key '%s'", columns[c]);
                break;
            } else {
                ret = scan_fail(s, at, "key '%s': expected a string or a number", columns[c]);
                break;
            }
            if (manifest_push(s->m, text, strlen(text), &cells[c]) < 0)
                ret = scan_oom(s);
        }
        cJSON_Delete(obj);
        if (ret)
            return ret;
    }
    return 0;
}

/* ---- the file ------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int manifest_open(const char *path, int format, const char *const columns[], size_t n_columns,
                  manifest **ret_manifest, char *errbuf)
{
    char ebuf[128];
    char *text = NULL;
    int fd = -1, ret = 0;
    manifest *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "%s: out of memory", path);
        goto out;
    }
    m->n_columns = n_columns;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(errbuf, "%s: cannot read the manifest: %s", path, strerror_r(errno, ebuf, sizeof ebuf));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > MANIFEST_MAX_BYTES) {
        ret = LD_EDATASET;
        ld_errorf(errbuf, "%s: the manifest is %s", path,
                  S_ISREG(st.st_mode) ? "larger than 4 GiB" : "not a regular file");
        goto out;
    }
    size_t size = (size_t)st.st_size, got = 0;
    if (!(text = malloc(size + 1))) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "%s: out of memory", path);
        goto out;
    }
    while (got < size) {
        ssize_t n = read(fd, text + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            ret = n < 0 ? ld_from_errno(errno) : LD_EDATASET;
            ld_errorf(errbuf, "%s: cannot read the manifest: %s", path,
                      n < 0 ? strerror_r(errno, ebuf, sizeof ebuf) : "it shrank while read");
            goto out;
        }
        got += (size_t)n;
    }
    text[size] = '\0';
    m->hash = XXH3_64bits(text, size);
    if (format == MANIFEST_AUTO)
        format = ends_with(path, ".jsonl") || ends_with(path, ".ndjson") ? MANIFEST_JSONL : MANIFEST_CSV;
    struct manifest_scan s = {.m = m, .p = text, .end = text + size, .line = 1, .errbuf = errbuf};
    ret = format == MANIFEST_JSONL ? jsonl_read(&s, columns, n_columns) : csv_read(&s, columns, n_columns);
    if (ret < 0)
        goto out;
    if (m->rows == 0) {
        ret = LD_EDATASET;
        ld_errorf(errbuf, "%s: the manifest lists no sample", path);
        goto out;
    }
    *ret_manifest = m;
    m = NULL;
out:
    if (fd >= 0)
        close(fd);
    free(text);
    manifest_free(m);
    return ret;
}

void manifest_free(manifest *m)
{
    if (!m)
        return;
    free(m->path);
    free(m->cells);
    free(m->runs);
    free(m->arena);
    free(m);
}

size_t manifest_rows(const manifest *m)
{
    return m->rows;
}

const char *manifest_cell(const manifest *m, size_t row, size_t col)
{
    return m->arena + m->cells[row * m->n_columns + col];
}

uint64_t manifest_line(const manifest *m, size_t row)
{
    const struct manifest_line_run *r = &m->runs[arena_run_find(m->runs, m->n_runs, sizeof *m->runs, row)];
    return r->line + (row - r->row);
}

const char *manifest_path(const manifest *m)
{
    return m->path;
}

uint64_t manifest_hash(const manifest *m)
{
    return m->hash;
}
