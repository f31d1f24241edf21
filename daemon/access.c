/* access — the check of a connection's credentials against the config's `access:` rules
 * (access.h), and the words a denial uses to say what was denied and for whom.
 *
 * Names in messages come from the user database at the time of the message (getpwuid_r,
 * getgrgid_r): a denial is rare, and a number alone tells the operator little. */
#include "access.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool access_has(const uint32_t *ids, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

bool access_allows(const struct access_rule *r, const struct access_peer *p, uint32_t self_uid)
{
    if (!r || !r->set || p->uid == 0 || p->uid == self_uid)
        return true;
    if (access_has(r->uids, r->n_uids, p->uid) || access_has(r->gids, r->n_gids, p->gid))
        return true;
    for (size_t i = 0; i < p->n_groups; i++)
        if (access_has(r->gids, r->n_gids, p->groups[i]))
            return true;
    return false;
}

const struct access_rule *access_dataset_rule(const struct access_config *a, const char *name)
{
    for (size_t i = 0; i < a->n_datasets; i++)
        if (strcmp(a->datasets[i].dataset, name) == 0)
            return &a->datasets[i].rule;
    return NULL;
}

const struct access_declare *access_declare_next(const struct access_config *a, const struct access_peer *p,
                                                 uint32_t self_uid, size_t *pos)
{
    while (*pos < a->n_declare) {
        const struct access_declare *e = &a->declare[(*pos)++];
        if (access_allows(&e->rule, p, self_uid))
            return e;
    }
    return NULL;
}

static void access_user_name(uint32_t uid, char *buf, size_t size)
{
    struct passwd pw, *found = NULL;
    char tmp[2048];
    if (getpwuid_r((uid_t)uid, &pw, tmp, sizeof tmp, &found) == 0 && found)
        snprintf(buf, size, "%u (%s)", uid, found->pw_name);
    else
        snprintf(buf, size, "%u", uid);
}

static void access_group_name(uint32_t gid, char *buf, size_t size)
{
    struct group gr, *found = NULL;
    char tmp[4096];
    if (getgrgid_r((gid_t)gid, &gr, tmp, sizeof tmp, &found) == 0 && found)
        snprintf(buf, size, "%u (%s)", gid, found->gr_name);
    else
        snprintf(buf, size, "%u", gid);
}

void access_describe_peer(const struct access_peer *p, char *buf, size_t size)
{
    char u[96], g[96];
    access_user_name(p->uid, u, sizeof u);
    access_group_name(p->gid, g, sizeof g);
    snprintf(buf, size, "uid %s, gid %s", u, g);
}

/* Appends to buf (size bytes, len used so far), cutting at the end. */
static void access_append(char *buf, size_t size, size_t *len, const char *a, const char *b)
{
    if (*len + 1 >= size)
        return;
    int w = snprintf(buf + *len, size - *len, "%s%s", a, b);
    *len = w < 0 || (size_t)w >= size - *len ? size - 1 : *len + (size_t)w;
}

void access_describe_rule(const struct access_rule *r, char *buf, size_t size)
{
    size_t len = 0;
    char one[96];
    buf[0] = '\0';
    for (size_t i = 0; i < r->n_uids; i++) {
        access_user_name(r->uids[i], one, sizeof one);
        access_append(buf, size, &len, i ? ", " : "users ", one);
    }
    for (size_t i = 0; i < r->n_gids; i++) {
        access_group_name(r->gids[i], one, sizeof one);
        access_append(buf, size, &len, i ? ", " : (len ? "; groups " : "groups "), one);
    }
    if (!r->n_uids && !r->n_gids)
        snprintf(buf, size, "nobody but root and the daemon's user");
}

void access_rule_clear(struct access_rule *r)
{
    free(r->uids);
    free(r->gids);
    *r = (struct access_rule){0};
}

void access_config_clear(struct access_config *a)
{
    access_rule_clear(&a->connect);
    access_rule_clear(&a->operators);
    for (size_t i = 0; i < a->n_datasets; i++) {
        free(a->datasets[i].dataset);
        access_rule_clear(&a->datasets[i].rule);
    }
    free(a->datasets);
    for (size_t i = 0; i < a->n_declare; i++) {
        access_rule_clear(&a->declare[i].rule);
        for (size_t k = 0; k < a->declare[i].n_roots; k++)
            free(a->declare[i].roots[k]);
        free(a->declare[i].roots);
        free(a->declare[i].cache_dir);
    }
    free(a->declare);
    *a = (struct access_config){0};
}
