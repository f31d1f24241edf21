/* dataset_watch — a folder dataset (`files`, `image_folder`) follows files added to or
 * removed from its folder while the daemon runs.
 *
 * The dataset's list of samples is made by the scan at open. A watch remembers the
 * folders that scan found samples in (and the root) with their modification times; at
 * every stream open (loop thread) it stats them, a few hundred system calls for
 * ImageNet's thousand class folders, and when one changed (an entry was added, removed
 * or renamed in it) it scans the folder again. A new list replaces the server's
 * dataset for the streams opened from then on; streams already open keep the dataset
 * they were opened on, which is freed when the last of them (and any cache job using
 * it) is gone (dataset_hold / dataset_release).
 *
 * Limits: a folder that held no sample at the last scan is not watched (a sample put
 * into a new sub-folder is seen through its parent's change only when that parent is
 * watched); the rescan runs on the loop thread, so the open that notices a change
 * waits for it (milliseconds per thousand files) and so do other clients' requests.
 * Kinds without a folder (token_windows, packed) never change. */
#ifndef LD_DATASET_WATCH_H
#define LD_DATASET_WATCH_H

#include <stdbool.h>

#include "config.h"
#include "dataset.h"

typedef struct dataset_watch dataset_watch;

/* Remembers the folders of d (opened from cfg, which must outlive the watch). */
int dataset_watch_new(const struct config_dataset *cfg, const dataset *d, dataset_watch **ret_watch, char *errbuf);
void dataset_watch_free(dataset_watch *w);

/* At a stream open: when a watched folder changed, scans again; when the list of
 * samples differs, *pd (the server's entry) becomes the new dataset and the old one is
 * retired (freed once released by all its holders). Returns 1 when *pd was replaced,
 * 0 when not, a negative code when the rescan failed (*pd is kept; errbuf says why). */
int dataset_watch_refresh(dataset_watch *w, dataset **pd, char *errbuf);

/* References of the loop thread's holders of a dataset (a stream, a cache job). The
 * daemon's own entry is not counted: a dataset is freed when it is retired and its
 * last holder releases it; the current ones are freed at exit by their owner. */
void dataset_hold(dataset *d);
void dataset_release(dataset *d);

#endif
