/* declare — a dataset a trainer declares at open: the grant (access.declare), the
 * spec read by the config's tables, the path resolved beneath an allowed root, and the
 * trainer's own right to read every file, checked before the first batch (declare.h). */
#include "declare.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "beneath.h"
#include "declare_cache.h"
#include "ld_error.h"
#include "proto.h"

/* The keys that say where a template's samples come from: the operator's, never the
 * trainer's (a trainer who may use `imagenet` may not point it elsewhere). */
static const char *const declare_source_keys[] = {
    "kind", "path", "connection", "pattern", "format", "manifest", "query", "key", "columns", "version_query",
    "cache", "follow_links", "fields", "index",
};

/* The keys of the scheduling the operator sets (scheduler.h): a declared dataset, and a
 * refined template, keep the operator's (1 and no cap for a whole spec), so that a
 * trainer cannot raise its own share of the workers. */
static const char *const declare_operator_keys[] = {"weight", "max_share"};

/* ---- who: the grants ------------------------------------------------------------ */

static int declare_denied_peer(const struct config *cfg, const struct access_peer *peer, char *errbuf)
{
    char who[160], rules[400] = "", one[224];
    access_describe_peer(peer, who, sizeof who);
    if (!cfg->access.n_declare) {
        ld_errorf(errbuf, "permission denied: %s may not declare datasets: declaring is off (the daemon's config "
                  "has no access.declare)", who);
        return LD_EDENIED;
    }
    size_t len = 0;
    for (size_t i = 0; i < cfg->access.n_declare && len + 1 < sizeof rules; i++) {
        access_describe_rule(&cfg->access.declare[i].rule, one, sizeof one);
        int w = snprintf(rules + len, sizeof rules - len, "%s%s", i ? "; or " : "", one);
        len = w < 0 || (size_t)w >= sizeof rules - len ? sizeof rules - 1 : len + (size_t)w;
    }
    ld_errorf(errbuf, "permission denied: %s may not declare datasets (access.declare allows %s)", who, rules);
    return LD_EDENIED;
}

/* Whether `path` is `root` or beneath it (component by component). */
static bool declare_beneath(const char *path, const char *root)
{
    size_t n = strlen(root);
    return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The grant whose root holds `path` (and the root), or NULL. */
static const struct access_declare *declare_grant_for(const struct config *cfg, const struct access_peer *peer,
                                                      uint32_t self_uid, const char *path, const char **ret_root)
{
    size_t pos = 0;
    const struct access_declare *g;
    while ((g = access_declare_next(&cfg->access, peer, self_uid, &pos)))
        for (size_t i = 0; i < g->n_roots; i++)
            if (declare_beneath(path, g->roots[i])) {
                *ret_root = g->roots[i];
                return g;
            }
    return NULL;
}

/* "/data/a, /data/b": the roots the peer is granted, for a message. */
static void declare_roots(const struct config *cfg, const struct access_peer *peer, uint32_t self_uid, char *buf,
                          size_t size)
{
    size_t pos = 0, len = 0;
    const struct access_declare *g;
    buf[0] = '\0';
    while ((g = access_declare_next(&cfg->access, peer, self_uid, &pos)))
        for (size_t i = 0; i < g->n_roots && len + 1 < size; i++) {
            int w = snprintf(buf + len, size - len, "%s%s", len ? ", " : "", g->roots[i]);
            len = w < 0 || (size_t)w >= size - len ? size - 1 : len + (size_t)w;
        }
}

/* Whether any grant the peer passes allows plug-ins. */
static bool declare_plugins_granted(const struct config *cfg, const struct access_peer *peer, uint32_t self_uid)
{
    size_t pos = 0;
    const struct access_declare *g;
    while ((g = access_declare_next(&cfg->access, peer, self_uid, &pos)))
        if (g->plugins)
            return true;
    return false;
}

/* ---- what: the mode bits ------------------------------------------------------- */

/* Whether the peer may do `want` (4 read, 2 write, 1 search) to what st describes, as
 * the kernel's permission check reads the mode bits: the owner's bits for the owner,
 * the group's for a member, the others' for the rest. Root may read and search all. */
static bool declare_may(const struct stat *st, const struct access_peer *p, unsigned want)
{
    if (p->uid == 0)
        return true;
    unsigned bits;
    bool member = st->st_gid == p->gid;
    for (size_t i = 0; !member && i < p->n_groups; i++)
        member = st->st_gid == p->groups[i];
    if (st->st_uid == p->uid)
        bits = (st->st_mode >> 6) & 7;
    else if (member)
        bits = (st->st_mode >> 3) & 7;
    else
        bits = st->st_mode & 7;
    return (bits & want) == want;
}

static int declare_refuse(const struct access_peer *peer, const char *path, const struct stat *st,
                          const char *what, char *errbuf)
{
    char who[160];
    access_describe_peer(peer, who, sizeof who);
    ld_errorf(errbuf, "permission denied: %s cannot %s '%s' (mode %04o, owner uid %u, group %u): a declared "
              "dataset is read only where its trainer could read it", who, what, path,
              (unsigned)(st->st_mode & 07777), (unsigned)st->st_uid, (unsigned)st->st_gid);
    return LD_EDENIED;
}

/* Every directory from / down to `real` (absolute, the dataset's directory as the
 * kernel names it) may be searched by the peer, and `real` itself listed. */
static int declare_check_chain(const struct access_peer *peer, const char *real, char *errbuf)
{
    char prefix[PATH_MAX];
    size_t n = strlen(real);
    if (n >= sizeof prefix)
        return LD_ENAMETOOLONG;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && real[i] != '/')
            continue;
        memcpy(prefix, real, i);
        prefix[i] = '\0';
        struct stat st;
        if (stat(prefix, &st) < 0) {
            ld_errorf(errbuf, "spec.path: cannot stat '%s': %s", prefix, strerror(errno));
            return ld_from_errno(errno);
        }
        unsigned want = i == n ? 5 : 1;
        if (!declare_may(&st, peer, want))
            return declare_refuse(peer, prefix, &st, i == n ? "list the directory" : "enter the directory",
                                  errbuf);
    }
    return 0;
}

/* The directories of `rel_dir` (relative to the dataset's directory, dirfd) that are
 * not in `done` (the last directory checked, which a sorted list shares most of): each
 * may be listed and searched by the peer. */
static int declare_check_dirs(int dirfd, const char *real, const struct access_peer *peer, const char *rel_dir,
                              char *done, char *errbuf)
{
    char prefix[PATH_MAX];
    size_t n = strlen(rel_dir);
    if (strcmp(rel_dir, done) == 0)
        return 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && rel_dir[i] != '/')
            continue;
        memcpy(prefix, rel_dir, i);
        prefix[i] = '\0';
        /* A prefix of the last one checked was checked with it. */
        if (declare_beneath(done, prefix))
            continue;
        struct stat st;
        if (fstatat(dirfd, prefix, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            ld_errorf(errbuf, "spec.path: cannot stat '%s/%s': %s", real, prefix, strerror(errno));
            return ld_from_errno(errno);
        }
        if (!declare_may(&st, peer, 5)) {
            char full[PATH_MAX + 8];
            snprintf(full, sizeof full, "%s/%s", real, prefix);
            return declare_refuse(peer, full, &st, "list the directory", errbuf);
        }
    }
    snprintf(done, PATH_MAX, "%s", rel_dir);
    return 0;
}

/* The trainer may read every sample of d, and list every directory on the way to it;
 * a sample that is a link (inside the dataset's directory: the scan saw to that) is
 * checked where it leads. */
static int declare_check_samples(const dataset *d, const struct beneath *b, const struct access_peer *peer,
                                 char *errbuf)
{
    char done[PATH_MAX] = "", dir[PATH_MAX], target[PATH_MAX], proc[64];
    int rc = 0;
    for (uint64_t i = 0; i < d->count && rc == 0; i++) {
        const char *rel = dataset_sample_name(d, i);
        struct stat st;
        if (fstatat(b->rootfd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            ld_errorf(errbuf, "spec.path: cannot stat '%s/%s': %s", b->real, rel, strerror(errno));
            return ld_from_errno(errno);
        }
        if (S_ISLNK(st.st_mode)) {
            int fd = -1;
            if ((rc = beneath_open_any(b, rel, &fd)) < 0) {
                ld_errorf(errbuf, "permission denied: '%s/%s' leads outside '%s'", b->real, rel, b->real);
                return LD_EDENIED;
            }
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(proc, target, sizeof target - 1);
            int fst = fstat(fd, &st);
            close(fd);
            bool known = n > 0 && fst == 0 && (size_t)n < sizeof target - 1 && b->real;
            if (known)
                target[n] = '\0';
            if (!known || !declare_beneath(target, b->real)) {
                ld_errorf(errbuf, "permission denied: '%s/%s' is a link whose end cannot be checked", b->real,
                          rel);
                return LD_EDENIED;
            }
            rel = target[b->real_len] == '/' ? target + b->real_len + 1 : target + b->real_len;
        }
        const char *slash = strrchr(rel, '/');
        size_t dlen = slash ? (size_t)(slash - rel) : 0;
        if (dlen >= sizeof dir)
            return LD_ENAMETOOLONG;
        memcpy(dir, rel, dlen);
        dir[dlen] = '\0';
        if ((rc = declare_check_dirs(b->rootfd, b->real, peer, dir, done, errbuf)) < 0)
            return rc;
        if (!declare_may(&st, peer, 4)) {
            char full[PATH_MAX * 2];
            snprintf(full, sizeof full, "%s/%s", b->real, rel);
            return declare_refuse(peer, full, &st, "read", errbuf);
        }
    }
    return rc;
}

/* ---- the spec ------------------------------------------------------------------- */

/* The template's definition with the trainer's keys in place of its own, as JSON
 * text (malloc'd), or NULL with errbuf set. */
static char *declare_refine(const struct config *cfg, size_t t, const cJSON *over, int *ret_rc, char *errbuf)
{
    for (const cJSON *k = over->child; k; k = k->next)
        for (size_t i = 0; i < sizeof declare_source_keys / sizeof *declare_source_keys; i++)
            if (strcmp(k->string, declare_source_keys[i]) == 0) {
                ld_errorf(errbuf, "permission denied: spec.%s: the source of template '%s' is the operator's and "
                          "cannot be changed (refine its transforms and options, or declare a full spec "
                          "beneath an allowed root)", k->string, cfg->datasets[t].name);
                *ret_rc = LD_EDENIED;
                return NULL;
            }
    cJSON *def = cJSON_Parse(cfg->dataset_json[t]);
    char *text = NULL;
    if (def) {
        /* The cache file belongs to the configured dataset and its keeper. */
        cJSON_DeleteItemFromObjectCaseSensitive(def, "cache");
        for (const cJSON *k = over->child; k; k = k->next) {
            cJSON *copy = cJSON_Duplicate(k, true);
            if (!copy || (cJSON_GetObjectItemCaseSensitive(def, k->string)
                              ? !cJSON_ReplaceItemInObjectCaseSensitive(def, k->string, copy)
                              : !cJSON_AddItemToObject(def, k->string, copy))) {
                cJSON_Delete(copy);
                cJSON_Delete(def);
                def = NULL;
                break;
            }
        }
        text = def ? cJSON_PrintUnformatted(def) : NULL;
    }
    cJSON_Delete(def);
    if (!text) {
        ld_errorf(errbuf, "out of memory");
        *ret_rc = LD_ENOMEM;
    }
    return text;
}

/* The directory of the config file, for the template's relative paths. */
static void declare_config_dir(const struct config *cfg, char *buf, size_t size)
{
    const char *slash = cfg->file ? strrchr(cfg->file, '/') : NULL;
    if (!slash)
        snprintf(buf, size, ".");
    else if (slash == cfg->file)
        snprintf(buf, size, "/");
    else
        snprintf(buf, size, "%.*s", (int)(slash - cfg->file), cfg->file);
}

/* The path of a full spec: no "..", beneath a granted root; resolved there. On success
 * *ret_grant is the grant of that root, *ret_root holds the root open and *ret_dirfd
 * the dataset's directory (O_PATH). */
static int declare_resolve(const struct config *cfg, const struct access_peer *peer, uint32_t self_uid,
                           const char *path, const struct access_declare **ret_grant, struct beneath *ret_root,
                           int *ret_dirfd, char *errbuf)
{
    char roots[512], ebuf[128];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            ld_errorf(errbuf, "permission denied: spec.path '%s' has a '..' component: name the directory beneath "
                      "an allowed root itself", path);
            return LD_EDENIED;
        }
        p += len;
        while (*p == '/')
            p++;
    }
    const char *root = NULL;
    const struct access_declare *grant = declare_grant_for(cfg, peer, self_uid, path, &root);
    if (!grant) {
        char who[160];
        access_describe_peer(peer, who, sizeof who);
        declare_roots(cfg, peer, self_uid, roots, sizeof roots);
        ld_errorf(errbuf, "permission denied: spec.path '%s' is outside the roots %s may declare datasets in (%s)",
                  path, who, roots);
        return LD_EDENIED;
    }
    int rc = beneath_root_open(root, BENEATH_LINKS_INSIDE, 0, ret_root);
    if (rc < 0) {
        ld_errorf(errbuf, "spec.path: the allowed root '%s' cannot be opened: %s", root,
                  strerror_r(-rc, ebuf, sizeof ebuf));
        return rc == -ENOENT ? LD_ENOENT : LD_EDATASET;
    }
    const char *rel = path + strlen(root);
    while (*rel == '/')
        rel++;
    char clean[PATH_MAX];
    size_t n = 0;
    /* "a//b/./c/": what openat2 resolves the same, written once. */
    for (const char *p = rel; *p && n + 1 < sizeof clean;) {
        size_t len = strcspn(p, "/");
        if (len && !(len == 1 && p[0] == '.')) {
            if (n + len + 2 >= sizeof clean)
                break;
            if (n)
                clean[n++] = '/';
            memcpy(clean + n, p, len);
            n += len;
        }
        p += len;
        while (*p == '/')
            p++;
    }
    clean[n] = '\0';
    rc = beneath_open_dir_path(ret_root, clean, ret_dirfd);
    if (rc == -EXDEV || rc == -ELOOP) {
        ld_errorf(errbuf, "permission denied: spec.path '%s' leads outside the allowed root '%s' (through a "
                  "symbolic link)", path, root);
        rc = LD_EDENIED;
    } else if (rc == -ENOENT || rc == -ENOTDIR) {
        ld_errorf(errbuf, "spec.path '%s': no such directory beneath the allowed root '%s'", path, root);
        rc = LD_ENOENT;
    } else if (rc < 0) {
        ld_errorf(errbuf, "spec.path '%s': %s", path, strerror_r(-rc, ebuf, sizeof ebuf));
    }
    if (rc < 0)
        beneath_root_close(ret_root);
    else
        *ret_grant = grant;
    return rc;
}

/* dataset_open's messages name the directory as it was opened (/proc/self/fd/N): the
 * trainer reads its own path instead. */
static void declare_message_path(char *errbuf, const char *opened, const char *shown)
{
    char out[LD_ERRMSG_MAX];
    size_t n = 0, olen = strlen(opened);
    for (const char *p = errbuf; *p && n + 1 < sizeof out;) {
        if (strncmp(p, opened, olen) == 0) {
            n += (size_t)snprintf(out + n, sizeof out - n, "%s", shown);
            if (n >= sizeof out)
                n = sizeof out - 1;
            p += olen;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    snprintf(errbuf, LD_ERRMSG_MAX, "%s", out);
}

/* The spec as JSON text for config_load_spec; a full spec's cache, which names no path
 * (the daemon places it), gets a stand-in one that the table requires and that
 * declare_open replaces. *ret_cache_path: the trainer named one (refused later). */
static char *declare_spec_text(const cJSON *spec, bool *ret_cache_path)
{
    const cJSON *cache = cJSON_GetObjectItemCaseSensitive(spec, "cache");
    *ret_cache_path = cJSON_IsObject(cache) && cJSON_GetObjectItemCaseSensitive(cache, "path");
    if (!cJSON_IsObject(cache) || *ret_cache_path)
        return cJSON_PrintUnformatted(spec);
    cJSON *copy = cJSON_Duplicate(spec, true);
    cJSON *c = copy ? cJSON_GetObjectItemCaseSensitive(copy, "cache") : NULL;
    char *text = c && cJSON_AddStringToObject(c, "path", "declared.ldcache") ? cJSON_PrintUnformatted(copy) : NULL;
    cJSON_Delete(copy);
    return text;
}

int declare_open(const struct config *cfg, const struct access_peer *peer, uint32_t self_uid, const cJSON *spec,
                 const char *template_name, dataset **ret_dataset, struct declare_cache *ret_cache, char *errbuf)
{
    struct config *sc = NULL;
    struct beneath root = {.rootfd = -1};
    int dirfd = -1;
    char *text = NULL, dir[PATH_MAX], real[PATH_MAX] = "", opened[64] = "";
    dataset *d = NULL;
    struct declare_cache place = {.dirfd = -1};
    bool cache_path_given = false;
    int rc;

    ret_cache->dirfd = -1;
    size_t pos = 0;
    const struct access_declare *first = access_declare_next(&cfg->access, peer, self_uid, &pos);
    if (!first)
        return declare_denied_peer(cfg, peer, errbuf);
    if (!cJSON_IsObject(spec)) {
        ld_errorf(errbuf, "field 'spec': expected a JSON object (a dataset's keys: kind, path, transforms, ...)");
        return LD_EFIELD;
    }
    for (size_t i = 0; i < sizeof declare_operator_keys / sizeof *declare_operator_keys; i++)
        if (cJSON_GetObjectItemCaseSensitive(spec, declare_operator_keys[i])) {
            ld_errorf(errbuf, "permission denied: spec.%s: a dataset's share of the workers is the operator's to "
                      "set (datasets.NAME.%s and clients.UID in the daemon's config)", declare_operator_keys[i],
                      declare_operator_keys[i]);
            return LD_EDENIED;
        }
    if (template_name) {
        size_t t = 0;
        while (t < cfg->n_datasets && strcmp(cfg->datasets[t].name, template_name) != 0)
            t++;
        if (t == cfg->n_datasets) {
            ld_errorf(errbuf, "no dataset named '%s' to refine (see `loaderctl datasets`)", template_name);
            return LD_ENODATASET;
        }
        if (!(text = declare_refine(cfg, t, spec, &rc, errbuf)))
            return rc;
        declare_config_dir(cfg, dir, sizeof dir);
    } else {
        if (!(text = declare_spec_text(spec, &cache_path_given))) {
            ld_errorf(errbuf, "out of memory");
            return LD_ENOMEM;
        }
        snprintf(dir, sizeof dir, "%s", first->roots[0]);
    }
    if ((rc = config_load_spec(text, strlen(text), dir, &sc, errbuf)) < 0)
        goto out;
    struct config_dataset *sd = &sc->datasets[0];
    const struct access_declare *grant = NULL; /* a full spec's: the one whose root holds its path */
    if (!template_name) {
        if (sd->kind != CONFIG_DATASET_FILES && sd->kind != CONFIG_DATASET_IMAGE_FOLDER) {
            ld_errorf(errbuf, "spec.kind: a trainer may declare files and image_folder datasets; a %s dataset is "
                      "configured by the operator", sd->kind == CONFIG_DATASET_TOKEN_WINDOWS ? "token_windows"
                      : sd->kind == CONFIG_DATASET_PACKED ? "packed" : sd->kind == CONFIG_DATASET_SQL ? "sql"
                      : "tar_shards");
            rc = LD_ENOTSUP;
            goto out;
        }
        if (sd->manifest_path) {
            ld_errorf(errbuf, "spec.manifest: a declared dataset is a directory tree; a manifest is configured by "
                      "the operator");
            rc = LD_ENOTSUP;
            goto out;
        }
        if (sd->follow_links == CONFIG_FOLLOW_LINKS_OUTSIDE) {
            ld_errorf(errbuf, "permission denied: spec.follow_links: outside is the operator's choice; links in a "
                      "declared dataset stay beneath its directory");
            rc = LD_EDENIED;
            goto out;
        }
        if ((rc = declare_resolve(cfg, peer, self_uid, sd->path, &grant, &root, &dirfd, errbuf)) < 0)
            goto out;
        if (sd->cache_path && !grant->caches) {
            char who[160];
            access_describe_peer(peer, who, sizeof who);
            ld_errorf(errbuf, "permission denied: spec.cache: %s may not declare a cache (the access.declare entry "
                      "for its root does not say caches: true)", who);
            rc = LD_EDENIED;
            goto out;
        }
        if (sd->cache_path && cache_path_given) {
            ld_errorf(errbuf, "permission denied: spec.cache.path: the daemon places a declared dataset's cache (in "
                      "the cache_dir of its access.declare grant, one directory per user): leave path out, e.g. "
                      "\"cache\": {\"mode\": \"auto\"}");
            rc = LD_EDENIED;
            goto out;
        }
        snprintf(opened, sizeof opened, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(opened, real, sizeof real - 1);
        if (n <= 0 || (size_t)n >= sizeof real - 1 || real[0] != '/') {
            ld_errorf(errbuf, "spec.path '%s': cannot tell where it leads (is /proc mounted?)", sd->path);
            rc = LD_EDENIED;
            goto out;
        }
        real[n] = '\0';
        if ((rc = declare_check_chain(peer, real, errbuf)) < 0)
            goto out;
        free(sd->path);
        if (!(sd->path = strdup(opened))) {
            rc = LD_ENOMEM;
            goto out;
        }
        sd->follow_links = CONFIG_FOLLOW_LINKS_INSIDE;
    }
    for (size_t t = 0; t < sd->n_transforms; t++)
        if (sd->transforms[t].kind == TRANSFORM_PLUGIN &&
            !(grant ? grant->plugins : declare_plugins_granted(cfg, peer, self_uid))) {
            char who[160];
            access_describe_peer(peer, who, sizeof who);
            ld_errorf(errbuf, "permission denied: spec.transforms[%zu]: %s may not declare transform plug-ins (%s "
                      "plugins: true)", t, who, grant ? "the access.declare entry of its root does not say"
                                                      : "no access.declare entry for it says");
            rc = LD_EDENIED;
            goto out;
        }
    if ((rc = dataset_open(sd, &d, errbuf)) < 0) {
        if (opened[0])
            declare_message_path(errbuf, opened, real);
        goto out;
    }
    if (!template_name) {
        /* The samples as the scan found them, through the same directory. */
        struct beneath b = {.rootfd = dirfd, .real = real, .real_len = strlen(real), .links = BENEATH_LINKS_INSIDE,
                            .walk = root.walk};
        if ((rc = declare_check_samples(d, &b, peer, errbuf)) < 0)
            goto out;
        free(sd->path);
        if (!(sd->path = strdup(real))) {
            rc = LD_ENOMEM;
            goto out;
        }
        snprintf(d->source, sizeof d->source, "%s", real);
        const char *base = strrchr(real, '/');
        snprintf(d->name, sizeof d->name, "spec:%.*s", LD_NAME_MAX - 6, base && base[1] ? base + 1 : real);
        if (sd->cache_path) {
            if ((rc = declare_cache_place(grant, peer->uid, real, spec, &place, errbuf)) < 0)
                goto out;
            free(sd->cache_path);
            if (!(sd->cache_path = strdup(place.shown))) {
                rc = LD_ENOMEM;
                goto out;
            }
        }
    } else {
        snprintf(d->name, sizeof d->name, "%.*s+spec", LD_NAME_MAX - 6, template_name);
    }
    d->owned_config = sc;
    sc = NULL;
    *ret_dataset = d;
    d = NULL;
    *ret_cache = place;
    place.dirfd = -1;
    rc = 0;
out:
    declare_cache_close(&place);
    dataset_free(d);
    config_free(sc);
    if (dirfd >= 0)
        close(dirfd);
    beneath_root_close(&root);
    cJSON_free(text);
    return rc;
}
