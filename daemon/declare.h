/* declare — datasets a trainer declares when it opens a stream, instead of naming one
 * the operator configured.
 *
 * A trainer sends a spec (the same keys as a dataset under `datasets:`, validated by
 * the config's own tables, config_load_spec) or names a configured dataset as a
 * template and sends the keys it changes (its own transforms, on_error, ...). What the
 * operator allows is the config's access.declare (access.h): who may declare, beneath
 * which roots, and whether a spec may carry a transform plug-in. A template's source
 * (kind, path, pattern, ...) is the operator's and cannot be changed; its cache stays
 * with the configured dataset (a refined template reads the source).
 *
 * A declared dataset is read only where its trainer could read it:
 *   - the spec's path is absolute, or relative to the first root the trainer is
 *     granted; it has no ".." component and lies beneath one of the trainer's roots;
 *   - it is resolved beneath that root with openat2(RESOLVE_BENEATH |
 *     RESOLVE_NO_MAGICLINKS) (beneath.h): a symbolic link leading out is refused;
 *     the dataset is then opened through that very descriptor (/proc/self/fd/N), so a
 *     rename between the check and the scan changes nothing; links found in the tree
 *     must stay beneath the dataset's directory (follow_links: inside);
 *   - every directory from / down to the dataset's, every directory the scan read and
 *     every sample file must grant the trainer's uid, gid or supplementary groups (as
 *     the kernel gave them at connect) the search, list and read bits that the
 *     kernel's own check would ask for. Mode bits, not ACLs: an ACL that grants more
 *     is not seen (the open is refused) and one that takes away from the mode bits is
 *     not seen either, so operators who rely on ACLs should not grant roots where
 *     they do. The check is done once, at open, by the daemon (which needs no
 *     privilege for it, runs as any user and sees the same tree the workers read),
 *     rather than by switching each worker's fsuid per read (which needs
 *     CAP_SETUID, and per-thread credentials that the worker pool shares between
 *     streams of different users).
 * Any failure is permission_denied naming the path, the peer and what was missing.
 *
 * The dataset is owned by the streams opened on it: the caller marks it retired once
 * a stream holds it (dataset_watch.h), and the last stream's close frees it together
 * with its config (dataset.owned_config), and with its cache keeper when it has one.
 *
 * A full spec may have a cache where the grant of its root says caches: true: the
 * trainer gives its options (mode, fingerprint) but never its path; the daemon places
 * it in the grant's cache_dir, in the trainer's own directory there (declare_cache.h),
 * within the grant's cache_quota (cache_quota.h).
 *
 * Blocking (the scan and the check take milliseconds per thousand files): the server
 * runs it on a thread of the open's own, so the loop goes on serving meanwhile. It
 * reads only cfg (which the caller keeps alive until it returns) and what it is given. */
#ifndef LD_DECLARE_H
#define LD_DECLARE_H

#include <stdint.h>
#include <cJSON.h>

#include "access.h"
#include "config.h"
#include "dataset.h"
#include "declare_cache.h"

/* Opens the dataset that `spec` (a JSON object) declares, for `peer`, under cfg's
 * access.declare; with template_name, `spec` holds the keys that change the configured
 * dataset of that name (whose access.datasets rule the caller has checked). 0 and
 * *ret_dataset (owning its config), or: LD_EDENIED (not allowed: errbuf names what and
 * for whom), LD_ECONFIG (the spec is wrong: "spec.KEY: ..."), LD_ENODATASET (no such
 * template), LD_ENOTSUP (a kind or key a trainer cannot declare), LD_ENOENT or
 * another code of dataset_open with its message. *ret_cache: where the dataset's cache
 * goes (its dirfd the caller's, for cache_keeper_new_at), dirfd -1 when it has none. */
int declare_open(const struct config *cfg, const struct access_peer *peer, uint32_t self_uid, const cJSON *spec,
                 const char *template_name, dataset **ret_dataset, struct declare_cache *ret_cache, char *errbuf);

#endif
