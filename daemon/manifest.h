/* manifest — a CSV or JSONL file that lists a dataset's samples, one row each.
 *
 * A `files` dataset with a `manifest:` takes its samples, labels and other per-sample
 * values from such a file instead of folder names (source_manifest.c). This module
 * only reads the file: it keeps, for every row, the text of the columns the dataset
 * declared and the line the row starts on, so that every later message can say
 * "train.csv:42: ...". CSV follows RFC 4180 (a header row names the columns; fields
 * separated by commas; double quotes around a field that holds commas, quotes or line
 * breaks, "" for a quote; LF or CRLF; a UTF-8 byte order mark is skipped; blank lines
 * are skipped). JSONL is one JSON object per line (blank lines skipped); a string value
 * is taken as it is, a number as its decimal text. Read once at open; the result is
 * immutable and may be read from any thread. */
#ifndef LD_MANIFEST_H
#define LD_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

/* The largest manifest read (a row of a few hundred bytes: millions of samples). */
#define MANIFEST_MAX_BYTES (UINT64_C(1) << 32)

enum manifest_format {
    MANIFEST_AUTO = 0,              /* from the file name: .jsonl or .ndjson, else CSV */
    MANIFEST_CSV = 1,
    MANIFEST_JSONL = 2,
};

typedef struct manifest manifest;

/* Reads the manifest at `path` and keeps columns[0..n_columns) of every row. Fails
 * with LD_EDATASET (or -errno when the file cannot be read) and a message in errbuf
 * (LD_ERRMSG_MAX) that starts with "PATH:LINE: " where a line is at fault: a declared
 * column the header lacks, a row with another number of fields than the header, an
 * unterminated quote, a JSONL line that is not an object or lacks a column or holds
 * a value that is neither a string nor a number. */
int manifest_open(const char *path, int format, const char *const columns[], size_t n_columns,
                  manifest **ret_manifest, char *errbuf);
void manifest_free(manifest *m);
/* Rows (samples). */
size_t manifest_rows(const manifest *m);
/* The text of column `col` (an index into the columns given to open) of `row`. */
const char *manifest_cell(const manifest *m, size_t row, size_t col);
/* The line `row` starts on, 1-based. */
uint64_t manifest_line(const manifest *m, size_t row);
/* The path it was read from, for messages. */
const char *manifest_path(const manifest *m);
/* An XXH3-64 hash of the file's bytes as read. */
uint64_t manifest_hash(const manifest *m);

#endif
