/* tar — reading the member list of a tar archive (ustar, pax and GNU long names), for
 * the `tar_shards` dataset kind (source_tar.c).
 *
 * Only the headers are read: each regular file member is reported with its full name
 * and where its data lies, so that a sample can later be read with one pread at that
 * offset. What a shard written by Python's tarfile, GNU tar or bsdtar holds is
 * understood: the ustar name and prefix, a pax extended header's `path` and `size`
 * (which override the ustar fields), GNU's `L` long names, base-256 sizes; directories,
 * links and other entries are skipped. Nothing read is trusted: every header's checksum
 * is verified, every length is checked against the file's size before it is used, and
 * a pax or long-name block is capped, so a corrupt or truncated archive is an error
 * that says what is wrong and at which byte offset, never a read past the end. Pure
 * function of the file's bytes; any thread. */
#ifndef LD_TAR_H
#define LD_TAR_H

#include <stdint.h>

#define TAR_BLOCK 512u
/* The longest member name accepted (a pax path or a GNU long name). */
#define TAR_NAME_MAX 4096u
/* The largest pax extended header read. */
#define TAR_PAX_MAX (1u << 20)

struct tar_member {
    const char *name;               /* NUL-terminated; valid during the callback only */
    uint64_t header_offset;         /* its first header block (a pax or long-name one, if any) */
    uint64_t offset;                /* its data */
    uint64_t size;                  /* bytes of data */
};

/* Called once per regular file member, in archive order. 0 continues; a negative code
 * stops the walk, which returns it (the callback writes its own message). */
typedef int (*tar_member_fn)(void *ctx, const struct tar_member *m);

/* Walks the archive open at fd, file_size bytes long, from the start to its end marker
 * (two zero blocks; one zero block or the end of the file at a header boundary is
 * accepted, as tar itself does). Blocking (pread). Returns 0, the callback's code, -errno
 * of a failed read, or LD_EDATASET for an archive that is not a valid tar, with
 * "offset N: what" in errbuf (LD_ERRMSG_MAX). */
int tar_walk(int fd, uint64_t file_size, tar_member_fn fn, void *ctx, char *errbuf);

#endif
