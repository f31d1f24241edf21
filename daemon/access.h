/* access — who may do what: the rules of the config's `access:` section and the check
 * of a connection's credentials against them.
 *
 * A rule lists users and groups (held as numbers; the config resolves names when it
 * loads). A peer passes a rule when its uid is listed, or when its primary group or
 * one of its supplementary groups (as the kernel reported them at connect) is listed.
 * A rule that is not set lets everyone through, which is the daemon's behaviour
 * without an `access:` section: whoever can reach the socket may do everything. Root
 * and the daemon's own user pass every rule: they own the process and its files. */
#ifndef LD_ACCESS_H
#define LD_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ACCESS_MAX_IDS 256
#define ACCESS_MAX_PEER_GROUPS 64

struct access_rule {
    bool set;                       /* false: everyone passes */
    uint32_t *uids;
    size_t n_uids;
    uint32_t *gids;
    size_t n_gids;
};

/* access.datasets.NAME: who may open streams on a configured dataset. */
struct access_dataset_rule {
    char *dataset;
    int line, column;               /* of its key in the config, for the check that it exists */
    struct access_rule rule;
};

/* One entry of access.declare: who (rule) may open streams on datasets they declare
 * themselves (a spec sent with `open`) beneath which directories (roots: absolute,
 * without a trailing slash), and whether such a spec may have a cache (which the daemon
 * writes) or a transform plug-in (which runs inside the daemon). A grant with caches
 * names the directory the daemon writes them in (cache_dir: each user's caches in a
 * subdirectory of their uid, declare_cache.h) and how many bytes of caches each user
 * may have there (cache_quota). */
struct access_declare {
    struct access_rule rule;
    char **roots;
    size_t n_roots;
    bool caches, plugins;
    char *cache_dir;                /* absolute, without a trailing slash; set when caches */
    uint64_t cache_quota;           /* bytes per user in cache_dir; set when caches */
    int line, column;               /* of the entry, for messages */
};

struct access_config {
    struct access_rule connect;     /* who may connect at all */
    struct access_rule operators;   /* cache_build, cache_verify, reload, stop */
    struct access_dataset_rule *datasets;
    size_t n_datasets;
    struct access_declare *declare; /* none: nobody may declare (templates included) */
    size_t n_declare;
};

/* A connection's credentials, as SO_PEERCRED and SO_PEERGROUPS gave them. */
struct access_peer {
    uint32_t uid, gid;
    const uint32_t *groups;
    size_t n_groups;
};

/* Whether p passes r. `self_uid` is the daemon's own uid (passes like root). */
bool access_allows(const struct access_rule *r, const struct access_peer *p, uint32_t self_uid);
/* The rule of access.datasets.<name>, or NULL (everyone who may connect). */
const struct access_rule *access_dataset_rule(const struct access_config *a, const char *name);
/* "uid 1001 (alice), gid 1001 (trainers)": the peer for a denial's message. */
void access_describe_peer(const struct access_peer *p, char *buf, size_t size);
/* "users alice(1001), 1002; groups vision(300)": what a rule allows, for a denial's message. */
void access_describe_rule(const struct access_rule *r, char *buf, size_t size);
/* The i-th entry of access.declare at or after *pos that p passes (then *pos is past
 * it), or NULL: iterate with pos = 0 until NULL. */
const struct access_declare *access_declare_next(const struct access_config *a, const struct access_peer *p,
                                                 uint32_t self_uid, size_t *pos);
void access_rule_clear(struct access_rule *r);
void access_config_clear(struct access_config *a);

#endif
