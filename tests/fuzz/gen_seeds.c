/* gen_seeds — writes the fuzzers' seed corpora (tests/fuzz/corpus/<fuzzer>/) from known
 * content, so that every committed seed can be regenerated and reviewed:
 *
 *   proto   frames of real requests and replies (encoded by proto_encode), one per file,
 *           and several joined in one stream, behind the harness's two control bytes;
 *   config  configs of each dataset kind and a full image pipeline;
 *   image   tiny JPEGs (baseline 4:2:0, 4:4:4, progressive, grayscale) and PNGs (RGB,
 *           palette, 16-bit gray, interlaced) behind the harness's 13-byte head, one per
 *           path it can take;
 *   cache   two small valid cache files built by cache_build from a real `files`
 *           dataset (fixed-size and ragged samples), behind the fix-up byte;
 *   reply   open replies for a fixed and a ragged layout (as the daemon writes them),
 *           behind the batch size and rows, with ring bytes after the NUL;
 *   npy     .npy files laid out as numpy writes them (versions 1.0, 2.0, 3.0; a matrix,
 *           a scalar, a vector, a Fortran-ordered one), with their data;
 *   manifest CSV (quoted fields, CRLF and a byte order mark) and JSONL manifests behind
 *           the harness's format byte;
 *   tar     WebDataset shards (ustar; pax and GNU long names, a directory, a link) and one
 *           cut short.
 *
 * Usage: gen_seeds OUTDIR (run by `make fuzz-seeds`). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache.h"
#include "config.h"
#include "dataset.h"
#include "ld_error.h"
#include "proto.h"

/* image_fixtures.h is written for cmocka tests; these stand in for its assertions. */
#define assert_non_null(p) do { if (!(p)) die("allocation failed"); } while (0)
#define assert_true(c) do { if (!(c)) die("fixture assertion failed: " #c); } while (0)
#define fail_msg(...) die(__VA_ARGS__)

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...);

#include <stdarg.h>
#include "../unit/image_fixtures.h"
#include "../unit/tar_fixtures.h"

static const char *outdir;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gen_seeds: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void mkdir_p(const char *dir)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                die("mkdir %s: %s", buf, strerror(errno));
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        die("mkdir %s: %s", buf, strerror(errno));
}

/* Writes OUTDIR/<fuzzer>/<name>: head (may be NULL) then body. */
static void seed(const char *fuzzer, const char *name, const void *head, size_t head_len,
                 const void *body, size_t body_len)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s", outdir, fuzzer);
    mkdir_p(dir);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        die("%s: %s", path, strerror(errno));
    if ((head_len && fwrite(head, 1, head_len, f) != head_len) ||
        (body_len && fwrite(body, 1, body_len, f) != body_len) || fclose(f) != 0)
        die("%s: write failed", path);
}

/* ---- proto ------------------------------------------------------------------------ */

static void proto_seeds(void)
{
    static const struct {
        const char *name, *json;
    } msgs[] = {
        {"hello", "{\"id\":1,\"op\":\"hello\",\"version\":1,\"client\":\"trainer\"}"},
        {"open", "{\"id\":2,\"op\":\"open\",\"dataset\":\"records\",\"batch_size\":32,\"shuffle\":true,"
                 "\"seed\":7,\"epoch\":0,\"rank\":0,\"world_size\":2,\"drop_last\":false,"
                 "\"start_batch\":3,\"prefetch\":4,\"epochs\":2}"},
        {"next", "{\"id\":3,\"op\":\"next\",\"stream\":1}"},
        {"release", "{\"id\":4,\"op\":\"release\",\"stream\":1,\"slot\":2,\"generation\":9}"},
        {"cache_build", "{\"id\":5,\"op\":\"cache_build\",\"dataset\":\"records\",\"force\":true}"},
        {"reply_ok", "{\"id\":2,\"ok\":true,\"stream\":1,\"batches\":10,\"fields\":[{\"name\":\"data\","
                     "\"dtype\":\"uint8\",\"shape\":[256],\"offset\":64}]}"},
        {"reply_error", "{\"id\":3,\"ok\":false,\"error\":{\"code\":\"bad_field\",\"errno\":-4003,"
                        "\"message\":\"field 'batch_size': expected an integer\"}}"},
        {"nested", "{\"id\":6,\"op\":\"status\",\"x\":[[[{\"a\":[1,2.5,-3e4,null,\"\\u00e9\"]}]]]}"},
    };
    char *all = NULL;
    size_t all_len = 0;
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        cJSON *obj = cJSON_Parse(msgs[i].json);
        char *frame = NULL;
        size_t len = 0;
        if (!obj || proto_encode(obj, &frame, &len) < 0)
            die("cannot encode %s", msgs[i].name);
        static const uint8_t whole[2] = {16, 0}, bytewise[2] = {0, 1};
        char name[64];
        snprintf(name, sizeof name, "%s", msgs[i].name);
        seed("proto", name, whole, 2, frame, len);
        snprintf(name, sizeof name, "%s-split", msgs[i].name);
        seed("proto", name, bytewise, 2, frame, len);
        all = realloc(all, all_len + len);
        assert_non_null(all);
        memcpy(all + all_len, frame, len);
        all_len += len;
        free(frame);
        cJSON_Delete(obj);
    }
    static const uint8_t chunks[2] = {6, 0};
    seed("proto", "joined", chunks, 2, all, all_len);
    free(all);
}

/* ---- config ----------------------------------------------------------------------- */

static void config_seeds(void)
{
    static const struct {
        const char *name, *text;
    } cfgs[] = {
        {"files.yaml", "server:\n  socket: /tmp/x.sock\n  workers: 2\n  memory_budget: 64MiB\n"
                       "  max_clients: 8\n  max_streams: 8\n  max_frame: 1MiB\n  prefetch: 4\n"
                       "  log_level: debug\n"
                       "datasets:\n  records:\n    kind: files\n    path: rec\n    pattern: \"*.bin\"\n"
                       "    on_error: fail\n"
                       "    cache:\n      path: rec.ldcache\n      mode: auto\n      fingerprint: content\n"},
        {"tokens.yaml", "datasets:\n  tokens:\n    kind: token_windows\n    path: tokens.bin\n"
                        "    dtype: uint32\n    context: 1024\n    stride: 512\n"
                        "  packed:\n    kind: packed\n    path: rec.ldcache\n"},
        {"images.yaml", "server:\n  workers: 1\n"
                        "datasets:\n  imagenet:\n    kind: image_folder\n    path: train\n"
                        "    on_error: replace\n    transforms:\n"
                        "      - decode: {max_pixels: 1000000, fast: true, strict: false, dct_scaling: true}\n"
                        "      - random_resized_crop: {height: 224, width: 224, scale: [0.08, 1.0], ratio: [0.75, 1.333]}\n"
                        "      - random_flip: {p: 0.5}\n"
                        "      - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n"
                        "      - to_dtype: {dtype: float16, layout: HWC}\n"
                        "  val:\n    kind: image_folder\n    path: val\n    transforms:\n"
                        "      - resize: {size: 256}\n      - center_crop: {height: 224, width: 224}\n"
                        "      - resize: {height: 112, width: 112}\n"
                        "      - plugin: {path: ./invert.so, params: {amount: 3}}\n"},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        seed("config", cfgs[i].name, NULL, 0, cfgs[i].text, strlen(cfgs[i].text));
}

/* ---- image ------------------------------------------------------------------------ */

static void image_seed(const char *name, uint8_t mode, const struct blob *b)
{
    /* mode, 8 bytes of sample index, then the direct decode's options and region. */
    uint8_t head[13] = {mode, 3, 0, 0, 0, 0, 0, 0, 0, 4 | 1, 5, 3, 2};
    seed("image", name, head, sizeof head, b->data, b->len);
}

static void image_seeds(void)
{
    const int w = 19, h = 13;
    uint8_t *px = picture_rgb(w, h);
    struct blob b[8];
    int n = 0;
    b[n++] = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 85, 0);
    b[n++] = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_444, 95, 0);
    b[n++] = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 75, TJFLAG_PROGRESSIVE);
    b[n++] = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_GRAY, 90, 0);
    b[n++] = png_encode_rgb(px, w, h);
    uint8_t pal_raw[13 * 19], pal[3 * 4] = {0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255};
    for (int i = 0; i < w * h; i++)
        pal_raw[i] = (uint8_t)(i % 4);
    b[n++] = png_encode(pal_raw, (size_t)w, w, h, PNG_COLOR_TYPE_PALETTE, 8, pal, 4, NULL, 0, 0);
    uint8_t g16[13 * 19 * 2];
    for (int i = 0; i < w * h * 2; i++)
        g16[i] = (uint8_t)(i * 7);
    b[n++] = png_encode(g16, (size_t)w * 2, w, h, PNG_COLOR_TYPE_GRAY, 16, NULL, 0, NULL, 0, 0);
    b[n++] = png_encode(px, (size_t)w * 3, w, h, PNG_COLOR_TYPE_RGB, 8, NULL, 0, NULL, 0, 1);
    static const char *const names[] = {"jpeg420", "jpeg444", "jpegprog", "jpeggray",
                                        "png",     "pngpal",  "pnggray16", "pnginterlaced"};
    for (int i = 0; i < n; i++) {
        for (uint8_t mode = 0; mode < 4; mode++) {
            char name[64];
            snprintf(name, sizeof name, "%s-%u", names[i], mode);
            image_seed(name, mode, &b[i]);
        }
        blob_free(&b[i]);
    }
    free(px);
}

/* ---- cache ------------------------------------------------------------------------ */

static void cache_seed(const char *name, const char *tmp, int ragged)
{
    char src[4200], file[4200], path[4300];
    snprintf(src, sizeof src, "%s/%s", tmp, name);
    for (int cls = 0; cls < 2; cls++) {
        snprintf(path, sizeof path, "%s/c%d", src, cls);
        mkdir_p(path);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/c%d/%d.bin", src, i % 2, i);
        uint8_t bytes[200];
        size_t len = ragged ? 40 + 70 * (size_t)i : 96;
        for (size_t j = 0; j < len; j++)
            bytes[j] = (uint8_t)(i * 31 + j);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(bytes, 1, len, f) != len || fclose(f) != 0)
            die("%s: write failed", path);
    }
    struct config_dataset cfg = {.name = "seed", .kind = CONFIG_DATASET_FILES, .path = src,
                                 .pattern = "*"};
    char err[LD_ERRMSG_MAX] = "";
    dataset *d = NULL;
    if (dataset_open(&cfg, &d, err) < 0)
        die("dataset_open: %s", err);
    snprintf(file, sizeof file, "%s/%s.ldcache", tmp, name);
    if (cache_build(d, file, 0x1234, NULL, NULL, NULL, err) < 0)
        die("cache_build: %s", err);
    dataset_free(d);

    FILE *f = fopen(file, "rb");
    if (!f)
        die("%s: %s", file, strerror(errno));
    static uint8_t buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* The source path and build time recorded in the header are this run's: blank them
     * so that the seed does not change from run to run. The "-fixup" seed has its
     * header and footer checksums zeroed (the fuzzer's fix-up byte recomputes them); the
     * other one has them recomputed here and is valid as it is. */
    static const uint8_t as_is = 0, fix_all = 0x1f;
    struct cache_header hd;
    struct cache_footer ft;
    memcpy(&hd, buf, sizeof hd);
    memcpy(&ft, buf + len - sizeof ft, sizeof ft);
    memset(hd.source, 0, sizeof hd.source);
    hd.build_time_ns = 0;
    hd.header_checksum = ft.header_checksum = ft.footer_checksum = 0;
    memcpy(buf, &hd, sizeof hd);
    memcpy(buf + len - sizeof ft, &ft, sizeof ft);
    char sname[64];
    snprintf(sname, sizeof sname, "%s-fixup", name);
    seed("cache", sname, &fix_all, 1, buf, len);
    hd.header_checksum = XXH3_64bits(&hd, offsetof(struct cache_header, header_checksum));
    ft.header_checksum = hd.header_checksum;
    ft.footer_checksum = XXH3_64bits(&ft, offsetof(struct cache_footer, footer_checksum));
    memcpy(buf, &hd, sizeof hd);
    memcpy(buf + len - sizeof ft, &ft, sizeof ft);
    seed("cache", name, &as_is, 1, buf, len);
}

static void cache_seeds(void)
{
    char tmp[] = "/tmp/ld-gen-seeds.XXXXXX";
    if (!mkdtemp(tmp))
        die("mkdtemp: %s", strerror(errno));
    cache_seed("fixed", tmp, 0);
    cache_seed("ragged", tmp, 1);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        die("cannot remove %s", tmp);
}

/* ---- reply ------------------------------------------------------------------------ */

static void reply_seeds(void)
{
    /* 4 slots of 8 KiB after the header page; batch size 16 (byte 1 = 15), 16 rows. */
    static const uint8_t head[4] = {0, 15, 0, 15};
    static const char fixed[] =
        "{\"id\":2,\"ok\":true,\"stream\":1,\"shm\":\"/loaderd.1.1\",\"shm_size\":36864,"
        "\"slot_count\":4,\"slot_size\":8192,\"slot_offset\":4096,\"batches_per_epoch\":10,"
        "\"samples_per_epoch\":160,\"batch_size\":16,\"fields\":["
        "{\"name\":\"data\",\"dtype\":\"uint8\",\"shape\":[256],\"ragged\":false,\"offset\":64},"
        "{\"name\":\"label\",\"dtype\":\"int64\",\"shape\":[],\"ragged\":false,\"offset\":4160}]}";
    static const char ragged[] =
        "{\"id\":2,\"ok\":true,\"stream\":1,\"shm\":\"/loaderd.1.2\",\"shm_size\":36864,"
        "\"slot_count\":4,\"slot_size\":8192,\"slot_offset\":4096,\"batches_per_epoch\":10,"
        "\"samples_per_epoch\":160,\"batch_size\":16,\"fields\":["
        "{\"name\":\"data\",\"dtype\":\"uint8\",\"shape\":[],\"ragged\":true,\"offset\":256,"
        "\"offsets_offset\":64,\"capacity\":4096},"
        "{\"name\":\"label\",\"dtype\":\"int64\",\"shape\":[],\"ragged\":false,\"offset\":4352}]}";
    /* After the NUL: the ring's bytes, repeated: 8 zero bytes, so every ragged offset
     * is 0 (valid: empty samples); the fuzzer grows it into real ones. */
    uint8_t body[sizeof ragged + 1 + 8];
    const char *texts[2] = {fixed, ragged};
    static const char *const names[2] = {"open-fixed", "open-ragged"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(texts[i]);
        memcpy(body, texts[i], n);
        memset(body + n, 0, 1 + 8);
        seed("reply", names[i], head, sizeof head, body, n + 1 + 8);
    }
}

/* ---- npy --------------------------------------------------------------------------- */

static void npy_seeds(void)
{
    static const struct {
        const char *name;
        int major;
        const char *dict;
        size_t data;
    } files[] = {
        {"f4-matrix-v1", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 48},
        {"u1-scalar-v2", 2, "{'descr': '|u1', 'fortran_order': False, 'shape': (), }", 1},
        {"i8-vector-v3", 3, "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (5,)}", 40},
        {"f2-fortran-v1", 1, "{'descr': '<f2', 'fortran_order': True, 'shape': (2, 2, 2), }", 16},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        uint8_t buf[256];
        size_t prefix = files[i].major == 1 ? 10 : 12, dlen = strlen(files[i].dict);
        size_t total = (prefix + dlen + 1 + 63) / 64 * 64, hlen = total - prefix;
        memcpy(buf, "\x93NUMPY", 6);
        buf[6] = (uint8_t)files[i].major;
        buf[7] = 0;
        buf[8] = (uint8_t)hlen;
        buf[9] = (uint8_t)(hlen >> 8);
        if (prefix == 12)
            buf[10] = buf[11] = 0;
        memcpy(buf + prefix, files[i].dict, dlen);
        memset(buf + prefix + dlen, ' ', total - prefix - dlen - 1);
        buf[total - 1] = '\n';
        for (size_t k = 0; k < files[i].data; k++)
            buf[total + k] = (uint8_t)(k * 37 + 1);
        seed("npy", files[i].name, NULL, 0, buf, total + files[i].data);
    }
}

/* ---- manifest ------------------------------------------------------------------------ */

static void manifest_seeds(void)
{
    static const struct {
        const char *name;
        uint8_t format;             /* the harness's byte 0: even CSV, odd JSONL */
        const char *text;
    } files[] = {
        {"csv-quoted", 0, "path,label\na/x.bin,3\n\"b,\"\"q\"\".bin\",\"two\nlines\"\n"},
        {"csv-crlf-bom", 0, "\xef\xbb\xbfid,label,path\r\n1,cat,a.bin\r\n\r\n2,dog,b.bin"},
        {"jsonl", 1, "{\"path\": \"a.bin\", \"label\": 3}\n\n{\"label\": \"cat\", \"path\": \"b.bin\"}\n"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        seed("manifest", files[i].name, &files[i].format, 1, files[i].text, strlen(files[i].text));
}

/* ---- tar ----------------------------------------------------------------------------- */

/* WebDataset shards: a plain ustar one, one with a pax long name and size, one with a
 * GNU long name, a directory and a link; and one cut in the middle of a member. */
static void tar_seeds(void)
{
    static uint8_t buf[16384];
    size_t len = 0;
    char longname[200];
    memset(longname, 'k', 150);
    strcpy(longname + 150, "/000002.seg.npy");
    tar_fixture_add(buf, &len, sizeof buf, "000000.jpg", "\xff\xd8\xff\xe0JFIF", 8, '0');
    tar_fixture_add(buf, &len, sizeof buf, "000000.cls", "3\n", 2, '0');
    tar_fixture_add(buf, &len, sizeof buf, "000001.txt", "a caption", 9, '0');
    tar_fixture_end(buf, &len, sizeof buf);
    seed("tar", "ustar", NULL, 0, buf, len);
    len = 0;
    tar_fixture_add(buf, &len, sizeof buf, "dir/", NULL, 0, '5');
    tar_fixture_add_pax(buf, &len, sizeof buf, "path", longname, "short", "\x93NUMPY", 6);
    tar_fixture_add(buf, &len, sizeof buf, "././@LongLink", "x/000003.cls", 13, 'L');
    tar_fixture_add(buf, &len, sizeof buf, "ignored", "7", 1, '0');
    tar_fixture_add(buf, &len, sizeof buf, "a-link", NULL, 0, '2');
    tar_fixture_end(buf, &len, sizeof buf);
    seed("tar", "pax-gnu", NULL, 0, buf, len);
    seed("tar", "truncated", NULL, 0, buf, len / 2 + 100);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        die("usage: gen_seeds OUTDIR");
    outdir = argv[1];
    proto_seeds();
    config_seeds();
    image_seeds();
    cache_seeds();
    reply_seeds();
    npy_seeds();
    manifest_seeds();
    tar_seeds();
    return 0;
}
