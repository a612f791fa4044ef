/*
 * A fake libnvidia-ml.so.1 for machines without a GPU, loaded by the real pynvml.
 *
 * Every entry point is defined with the signature NVIDIA's nvml.h declares (the
 * vendored include/nvml.h), so the compiler checks argument and struct types; pynvml's
 * ctypes layer (symbol lookup, struct layouts, versioned structs, error mapping)
 * runs unchanged above it. What a GPU answers comes from a profile: a key=value file
 * named by FAKE_NVML_PROFILE, read at nvmlInit (written from real nvidia-smi captures
 * by tests/support/cnvml/profiles.py). A key that is absent makes its call answer
 * NVML_ERROR_NOT_SUPPORTED. FAKE_NVML_SET="key=value;key=value" overrides profile keys.
 *
 * Driver branches: the build passes -DFAKE_NVML_BRANCH=<535|550|555|580>; an entry
 * point the branch lacks is not compiled at all, so pynvml's lookup fails with
 * NVML_ERROR_FUNCTION_NOT_FOUND exactly as on a real older driver.
 *
 * Faults (environment FAKE_NVML_<NAME>, or profile key fault.<name>), see knobs in
 * tests/support/cnvml/README.md:
 *   HANG=<function>[@<gpu>]:after_s=<a>:for_s=<b>[,...]   the call sleeps b s (<= 120) once a s passed
 *   LOST=<gpu>[:after_s=<a>][:after_calls=<n>][:until_s=<u>][,...]   GPU_IS_LOST from every per-GPU call
 *   BAD_HANDLE=<gpu>:<ERROR>[,...]    nvmlDeviceGetHandleByIndex(gpu) answers NVML_ERROR_<ERROR>
 *   ERRORS=<function>[@<gpu>]:<ERROR>[:after_s=<a>][,...]   any call answers NVML_ERROR_<ERROR>
 *   PROCESS_STRIDE=32     the _v3 process calls write 32-byte records (pynvml reads 24)
 *   GPM_NAN=1             every GPM metric is NaN
 *   RM_MISMATCH=<a>       every call, nvmlInit included, answers LIB_RM_VERSION_MISMATCH after a s
 *   XIDS=<gpu>:<xid>:at_s=<t>[,...]   XID events delivered through nvmlEventSetWait
 *   UNPRIVILEGED=1        a GPU in MIG mode lists its processes (the aggregate) to root only
 * Times count from the first nvmlInit of the process.
 */

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml.h"

#ifndef FAKE_NVML_BRANCH
#define FAKE_NVML_BRANCH 580
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_KEYS 1024
#define MAX_GPUS 16
#define MAX_MIG 8
#define MAX_RULES 32
#define HANG_CAP_S 120.0

/* --- profile: key=value store ---------------------------------------------------------- */

static char *keys[MAX_KEYS];
static char *values[MAX_KEYS];
static int key_count;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) end--;
    *end = '\0';
    return s;
}

static void put(const char *key, const char *value) {
    for (int i = 0; i < key_count; i++) {
        if (strcmp(keys[i], key) == 0) {
            free(values[i]);
            values[i] = strdup(value);
            return;
        }
    }
    if (key_count < MAX_KEYS) {
        keys[key_count] = strdup(key);
        values[key_count] = strdup(value);
        key_count++;
    }
}

static void put_line(char *line) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *eq = strchr(line, '=');
    if (!eq) return;
    *eq = '\0';
    put(trim(line), trim(eq + 1));
}

static const char *get(const char *key) {
    for (int i = 0; i < key_count; i++)
        if (strcmp(keys[i], key) == 0) return values[i];
    return NULL;
}

static void clear_profile(void) {
    for (int i = 0; i < key_count; i++) {
        free(keys[i]);
        free(values[i]);
    }
    key_count = 0;
}

static int load_profile(void) {
    const char *path = getenv("FAKE_NVML_PROFILE");
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    clear_profile();
    char line[4096];
    while (fgets(line, sizeof line, f)) put_line(line);
    fclose(f);
    const char *set = getenv("FAKE_NVML_SET");
    if (set) {
        char *copy = strdup(set), *save = NULL;
        for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save))
            put_line(item);
        free(copy);
    }
    return 1;
}

/* a fault knob: FAKE_NVML_<NAME> in the environment, else fault.<name> in the profile */
static const char *knob(const char *name) {
    char env[64], key[64];
    snprintf(env, sizeof env, "FAKE_NVML_%s", name);
    const char *v = getenv(env);
    if (v && *v) return v;
    snprintf(key, sizeof key, "fault.%s", name);
    for (char *p = key; *p; p++)
        if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    v = get(key);
    return (v && *v) ? v : NULL;
}

/* --- devices ----------------------------------------------------------------------------- */

struct nvmlDevice_st {
    int gpu;  /* index of the physical GPU */
    int mig;  /* -1: the physical GPU; else its MIG device index */
};

static struct nvmlDevice_st gpus[MAX_GPUS];
static struct nvmlDevice_st migs[MAX_GPUS][MAX_MIG];
static long per_gpu_calls[MAX_GPUS];

static int gpu_count(void) {
    const char *v = get("device_count");
    int n = v ? atoi(v) : 0;
    return n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : n);
}

static const char *dev_get(nvmlDevice_t d, const char *name) {
    char key[128];
    if (d->mig >= 0)
        snprintf(key, sizeof key, "gpu.%d.mig.%d.%s", d->gpu, d->mig, name);
    else
        snprintf(key, sizeof key, "gpu.%d.%s", d->gpu, name);
    return get(key);
}

static int dev_u64(nvmlDevice_t d, const char *name, unsigned long long *out) {
    const char *v = dev_get(d, name);
    if (!v || !*v) return 0;
    *out = strtoull(v, NULL, 0);
    return 1;
}

static int dev_uint(nvmlDevice_t d, const char *name, unsigned int *out) {
    unsigned long long v;
    if (!dev_u64(d, name, &v)) return 0;
    *out = (unsigned int)v;
    return 1;
}

static int dev_double(nvmlDevice_t d, const char *name, double *out) {
    const char *v = dev_get(d, name);
    if (!v || !*v) return 0;
    *out = strtod(v, NULL);
    return 1;
}

/* --- time, state, faults ----------------------------------------------------------------- */

static int init_count;
static int ever_initialised;
static struct timespec started;

static double elapsed_s(void) {
    if (!ever_initialised) return 0.0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0) {
    }
}

static const struct { const char *name; nvmlReturn_t code; } ERROR_NAMES[] = {
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
    {"ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE},
    {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
    {"TIMEOUT", NVML_ERROR_TIMEOUT},
    {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND},
    {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED},
    {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
    {"IN_USE", NVML_ERROR_IN_USE},
    {"MEMORY", NVML_ERROR_MEMORY},
    {"NO_DATA", NVML_ERROR_NO_DATA},
    {"VGPU_ECC_NOT_SUPPORTED", NVML_ERROR_VGPU_ECC_NOT_SUPPORTED},
    {"INSUFFICIENT_RESOURCES", NVML_ERROR_INSUFFICIENT_RESOURCES},
    {"FREQ_NOT_SUPPORTED", NVML_ERROR_FREQ_NOT_SUPPORTED},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH},
    {"DEPRECATED", NVML_ERROR_DEPRECATED},
    {"NOT_READY", NVML_ERROR_NOT_READY},
    {"GPU_NOT_FOUND", NVML_ERROR_GPU_NOT_FOUND},
    {"INVALID_STATE", NVML_ERROR_INVALID_STATE},
    {"UNKNOWN", NVML_ERROR_UNKNOWN},
};

static nvmlReturn_t error_code(const char *name) {
    if (strncmp(name, "NVML_ERROR_", 11) == 0) name += 11;
    for (size_t i = 0; i < sizeof ERROR_NAMES / sizeof ERROR_NAMES[0]; i++)
        if (strcmp(ERROR_NAMES[i].name, name) == 0) return ERROR_NAMES[i].code;
    return NVML_ERROR_UNKNOWN;
}

/* One comma-separated rule of a knob: "<head>:<opt>=<v>:<opt>=<v>" split into fields. */
struct rule {
    char head[96];     /* function name, or gpu index */
    int gpu;           /* from "<function>@<gpu>" or a numeric head; -1: any */
    char error[48];    /* the bare second field, when there is one */
    double after_s, for_s, at_s, until_s;
    long after_calls;
};

static int parse_rules(const char *text, struct rule *out, int max) {
    if (!text) return 0;
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item && n < max; item = strtok_r(NULL, ",", &save)) {
        struct rule *r = &out[n++];
        memset(r, 0, sizeof *r);
        r->gpu = -1;
        r->until_s = INFINITY;
        char *save2 = NULL;
        int field = 0;
        for (char *part = strtok_r(item, ":", &save2); part; part = strtok_r(NULL, ":", &save2), field++) {
            part = trim(part);
            char *eq = strchr(part, '=');
            if (field == 0) {
                char *at = strchr(part, '@');
                if (at) {
                    *at = '\0';
                    r->gpu = atoi(at + 1);
                }
                snprintf(r->head, sizeof r->head, "%s", part);
            } else if (eq) {
                *eq = '\0';
                double v = strtod(eq + 1, NULL);
                if (strcmp(part, "after_s") == 0) r->after_s = v;
                else if (strcmp(part, "for_s") == 0) r->for_s = v;
                else if (strcmp(part, "at_s") == 0) r->at_s = v;
                else if (strcmp(part, "until_s") == 0) r->until_s = v;
                else if (strcmp(part, "after_calls") == 0) r->after_calls = (long)v;
            } else {
                snprintf(r->error, sizeof r->error, "%s", part);
            }
        }
    }
    free(copy);
    return n;
}

static int gpu_is_lost(int gpu) {
    struct rule rules[MAX_RULES];
    int n = parse_rules(knob("LOST"), rules, MAX_RULES);
    double t = elapsed_s();
    for (int i = 0; i < n; i++) {
        if (atoi(rules[i].head) != gpu) continue;
        if (t >= rules[i].after_s && t < rules[i].until_s && per_gpu_calls[gpu] >= rules[i].after_calls)
            return 1;
    }
    return 0;
}

/* The faults every entry point meets first: version mismatch, a hang, a named error. */
static nvmlReturn_t faults(const char *function, int gpu) {
    const char *mismatch = knob("RM_MISMATCH");
    if (mismatch && elapsed_s() >= strtod(mismatch, NULL)) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    struct rule rules[MAX_RULES];
    int n = parse_rules(knob("HANG"), rules, MAX_RULES);
    for (int i = 0; i < n; i++) {
        if (strcmp(rules[i].head, function) == 0 && (rules[i].gpu < 0 || rules[i].gpu == gpu) &&
            elapsed_s() >= rules[i].after_s)
            sleep_s(rules[i].for_s < HANG_CAP_S ? rules[i].for_s : HANG_CAP_S);
    }
    n = parse_rules(knob("ERRORS"), rules, MAX_RULES);
    for (int i = 0; i < n; i++) {
        if (strcmp(rules[i].head, function) == 0 && (rules[i].gpu < 0 || rules[i].gpu == gpu) &&
            elapsed_s() >= rules[i].after_s)
            return error_code(rules[i].error);
    }
    return NVML_SUCCESS;
}

#define ENTER(function)                                              \
    do {                                                             \
        nvmlReturn_t fault_ = faults(function, -1);                  \
        if (fault_ != NVML_SUCCESS) return fault_;                   \
        if (init_count == 0) return NVML_ERROR_UNINITIALIZED;        \
    } while (0)

static int valid_device(nvmlDevice_t d) {
    if (!d) return 0;
    if (d >= &gpus[0] && d < &gpus[MAX_GPUS]) return d->gpu < gpu_count();
    if (d >= &migs[0][0] && d < &migs[MAX_GPUS][0]) return d->gpu < gpu_count();
    return 0;
}

#define ENTER_DEVICE(function, d)                                           \
    do {                                                                    \
        if (init_count == 0) return NVML_ERROR_UNINITIALIZED;               \
        if (!valid_device(d)) return NVML_ERROR_INVALID_ARGUMENT;           \
        __atomic_add_fetch(&per_gpu_calls[(d)->gpu], 1, __ATOMIC_RELAXED);  \
        nvmlReturn_t fault_ = faults(function, (d)->gpu);                   \
        if (fault_ != NVML_SUCCESS) return fault_;                          \
        if (gpu_is_lost((d)->gpu)) return NVML_ERROR_GPU_IS_LOST;           \
    } while (0)

#define SUPPORTED(expr) \
    do {                \
        if (!(expr)) return NVML_ERROR_NOT_SUPPORTED; \
    } while (0)

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!text) return NVML_ERROR_NOT_SUPPORTED;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* --- init, shutdown, system ---------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!ever_initialised) {
        clock_gettime(CLOCK_MONOTONIC, &started);
        ever_initialised = 1;
    }
    pthread_mutex_unlock(&lock);
    nvmlReturn_t fault = faults("nvmlInit", -1);
    if (fault != NVML_SUCCESS) return fault;
    pthread_mutex_lock(&lock);
    if (init_count == 0 && !load_profile()) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_DRIVER_NOT_LOADED;  /* the library without a driver (no profile) */
    }
    for (int i = 0; i < MAX_GPUS; i++) {
        gpus[i].gpu = i;
        gpus[i].mig = -1;
        for (int j = 0; j < MAX_MIG; j++) {
            migs[i][j].gpu = i;
            migs[i][j].mig = j;
        }
    }
    init_count++;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t result = NVML_SUCCESS;
    if (init_count == 0) result = NVML_ERROR_UNINITIALIZED;
    else init_count--;
    pthread_mutex_unlock(&lock);
    return result;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
        case NVML_ERROR_NOT_FOUND: return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        case NVML_ERROR_TIMEOUT: return "Timeout";
        case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
        case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
        case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
        case NVML_ERROR_DEPRECATED: return "Requested functionality has been deprecated";
        default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion");
    return copy_text(get("driver_version"), version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetNVMLVersion");
    return copy_text(get("nvml_version"), version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    ENTER("nvmlSystemGetCudaDriverVersion");
    const char *v = get("cuda_driver_version");
    SUPPORTED(v);
    *cudaDriverVersion = atoi(v);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* --- handles ------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    ENTER("nvmlDeviceGetCount");
    *deviceCount = (unsigned int)gpu_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByIndex");
    if ((int)index >= gpu_count() || !device) return NVML_ERROR_INVALID_ARGUMENT;
    struct rule rules[MAX_RULES];
    int n = parse_rules(knob("BAD_HANDLE"), rules, MAX_RULES);
    for (int i = 0; i < n; i++)
        if (atoi(rules[i].head) == (int)index) return error_code(rules[i].error);
    nvmlReturn_t fault = faults("nvmlDeviceGetHandleByIndex", (int)index);
    if (fault != NVML_SUCCESS) return fault;
    if (gpu_is_lost((int)index)) return NVML_ERROR_GPU_IS_LOST;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByUUID");
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gpu_count(); i++) {
        const char *u = dev_get(&gpus[i], "uuid");
        if (u && strcmp(u, uuid) == 0) {
            if (gpu_is_lost(i)) return NVML_ERROR_GPU_IS_LOST;
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
        for (int j = 0; j < MAX_MIG; j++) {
            u = dev_get(&migs[i][j], "uuid");
            if (u && strcmp(u, uuid) == 0) {
                *device = &migs[i][j];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* --- identity ---------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER_DEVICE("nvmlDeviceGetUUID", device);
    return copy_text(dev_get(device, "uuid"), uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER_DEVICE("nvmlDeviceGetName", device);
    return copy_text(dev_get(device, "name"), name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    ENTER_DEVICE("nvmlDeviceGetPciInfo", device);
    const char *bus_id = dev_get(device, "pci.bus_id");
    SUPPORTED(bus_id);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    /* the legacy form keeps a 4-digit domain: 0000:83:00.0 */
    const char *colon = strchr(bus_id, ':');
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", colon && colon - bus_id > 4 ? colon - 4 : bus_id);
    unsigned int value;
    if (dev_uint(device, "pci.domain", &value)) pci->domain = value;
    if (dev_uint(device, "pci.bus", &value)) pci->bus = value;
    if (dev_uint(device, "pci.device", &value)) pci->device = value;
    if (dev_uint(device, "pci.device_id", &value)) pci->pciDeviceId = value;
    if (dev_uint(device, "pci.sub_device_id", &value)) pci->pciSubSystemId = value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

#if FAKE_NVML_BRANCH >= 550
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    ENTER_DEVICE("nvmlDeviceGetNumaNodeId", device);
    SUPPORTED(dev_uint(device, "numa_node", node));
    return NVML_SUCCESS;
}
#endif

/* a kernel list ("0-23,48-71") from key as the bit mask NVML writes, 64 bits a word */
static nvmlReturn_t affinity_mask(nvmlDevice_t device, const char *key, unsigned int words, unsigned long *mask) {
    if (!mask || words == 0) return NVML_ERROR_INVALID_ARGUMENT;
    const char *text = device->mig < 0 ? dev_get(device, key) : NULL;  /* the parent's, on its handle */
    if (!text) return NVML_ERROR_NOT_SUPPORTED;
    memset(mask, 0, words * sizeof *mask);
    char *copy = strdup(text), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        unsigned int low, high;
        int got = sscanf(item, "%u-%u", &low, &high);
        if (got < 1) continue;
        if (got == 1) high = low;
        for (unsigned int n = low; n <= high && n < words * 64; n++) mask[n / 64] |= 1UL << (n % 64);
    }
    free(copy);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) {
    ENTER_DEVICE("nvmlDeviceGetCpuAffinity", device);
    return affinity_mask(device, "cpu_affinity", cpuSetSize, cpuSet);
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet,
                                                        nvmlAffinityScope_t scope) {
    ENTER_DEVICE("nvmlDeviceGetCpuAffinityWithinScope", device);
    if (scope != NVML_AFFINITY_SCOPE_NODE && scope != NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
    return affinity_mask(device, "cpu_affinity", cpuSetSize, cpuSet);
}

/* the NUMA nodes near the GPU (topo -m's "NUMA Affinity"), node or socket scope alike here */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize, unsigned long *nodeSet,
                                                nvmlAffinityScope_t scope) {
    ENTER_DEVICE("nvmlDeviceGetMemoryAffinity", device);
    if (scope != NVML_AFFINITY_SCOPE_NODE && scope != NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
    return affinity_mask(device, "memory_affinity", nodeSetSize, nodeSet);
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    ENTER_DEVICE("nvmlDeviceGetArchitecture", device);
    SUPPORTED(dev_uint(device, "architecture", arch));
    return NVML_SUCCESS;
}

/* --- clocks, utilisation, memory, power, temperature ------------------------------------------ */

static const char *clock_key(nvmlClockType_t type, int maximum) {
    switch (type) {
        case NVML_CLOCK_GRAPHICS: return maximum ? "clock.graphics_max_mhz" : "clock.graphics_mhz";
        case NVML_CLOCK_SM: return maximum ? "clock.sm_max_mhz" : "clock.sm_mhz";
        case NVML_CLOCK_MEM: return maximum ? "clock.memory_max_mhz" : "clock.memory_mhz";
        case NVML_CLOCK_VIDEO: return maximum ? "clock.video_max_mhz" : "clock.video_mhz";
        default: return NULL;
    }
}

/* clock.sm_mhz_cycle="a,b,c" with clock.sm_mhz_cycle_s=<s>: an unlocked SM clock that
 * swings, one value per period (graphics alike: one clock domain) */
static int current_clock(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    const char *cycle = (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) ? dev_get(device, "clock.sm_mhz_cycle") : NULL;
    double period = 0;
    if (cycle && dev_double(device, "clock.sm_mhz_cycle_s", &period) && period > 0) {
        unsigned int steps[16], n = 0;
        char *copy = strdup(cycle), *save = NULL;
        for (char *item = strtok_r(copy, ",", &save); item && n < 16; item = strtok_r(NULL, ",", &save))
            steps[n++] = (unsigned int)strtoul(item, NULL, 10);
        free(copy);
        if (n) {
            *clock = steps[(unsigned long)(elapsed_s() / period) % n];
            return 1;
        }
    }
    const char *key = clock_key(type, 0);
    return key && dev_uint(device, key, clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    ENTER_DEVICE("nvmlDeviceGetClockInfo", device);
    if (!clock_key(type, 0)) return NVML_ERROR_INVALID_ARGUMENT;
    SUPPORTED(current_clock(device, type, clock));
    return NVML_SUCCESS;
}

/* the applications clock target (nvidia-smi -ac): clock.applications_mhz; R590 answers
 * DEPRECATED ("Requested functionality has been deprecated" in the captures) */
static nvmlReturn_t applications_clock(nvmlDevice_t device, unsigned int *clock) {
    const char *state = dev_get(device, "clock.applications");
    if (state && strcmp(state, "deprecated") == 0) return NVML_ERROR_DEPRECATED;
    SUPPORTED(dev_uint(device, "clock.applications_mhz", clock));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType, unsigned int *clockMHz) {
    ENTER_DEVICE("nvmlDeviceGetApplicationsClock", device);
    if (!clockMHz || !clock_key(clockType, 0)) return NVML_ERROR_INVALID_ARGUMENT;
    if (clockType == NVML_CLOCK_MEM) SUPPORTED(dev_uint(device, "clock.memory_mhz", clockMHz));
    else return applications_clock(device, clockMHz);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType, nvmlClockId_t clockId, unsigned int *clockMHz) {
    ENTER_DEVICE("nvmlDeviceGetClock", device);
    if (!clockMHz || !clock_key(clockType, 0)) return NVML_ERROR_INVALID_ARGUMENT;
    switch (clockId) {
        case NVML_CLOCK_ID_CURRENT:
            SUPPORTED(current_clock(device, clockType, clockMHz));
            return NVML_SUCCESS;
        case NVML_CLOCK_ID_APP_CLOCK_TARGET:
            if (clockType == NVML_CLOCK_MEM) {
                SUPPORTED(dev_uint(device, "clock.memory_mhz", clockMHz));
                return NVML_SUCCESS;
            }
            return applications_clock(device, clockMHz);
        default:
            return NVML_ERROR_NOT_SUPPORTED;  /* default / customer boost targets: not kept */
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    ENTER_DEVICE("nvmlDeviceGetMaxClockInfo", device);
    const char *key = clock_key(type, 1);
    if (!key) return NVML_ERROR_INVALID_ARGUMENT;
    SUPPORTED(dev_uint(device, key, clock));
    return NVML_SUCCESS;
}

#if FAKE_NVML_BRANCH >= 535
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons) {
    ENTER_DEVICE("nvmlDeviceGetCurrentClocksEventReasons", device);
    SUPPORTED(dev_u64(device, "clock_event_reasons", clocksEventReasons));
    return NVML_SUCCESS;
}
#endif

/* the same bits under the older name, which every branch keeps */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons) {
    ENTER_DEVICE("nvmlDeviceGetCurrentClocksThrottleReasons", device);
    SUPPORTED(dev_u64(device, "clock_event_reasons", clocksThrottleReasons));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    ENTER_DEVICE("nvmlDeviceGetUtilizationRates", device);
    unsigned int gpu, memory = 0;
    SUPPORTED(dev_uint(device, "utilization.gpu_percent", &gpu));
    dev_uint(device, "utilization.memory_percent", &memory);
    utilization->gpu = gpu;
    utilization->memory = memory;
    return NVML_SUCCESS;
}

/* v1 counts the driver's reservation as used (used_v1 = used + reserved), as real drivers do */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER_DEVICE("nvmlDeviceGetMemoryInfo", device);
    unsigned long long total, used, reserved = 0;
    SUPPORTED(dev_u64(device, "memory.total_bytes", &total) && dev_u64(device, "memory.used_bytes", &used));
    dev_u64(device, "memory.reserved_bytes", &reserved);
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    ENTER_DEVICE("nvmlDeviceGetMemoryInfo_v2", device);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used, reserved = 0;
    SUPPORTED(dev_u64(device, "memory.total_bytes", &total) && dev_u64(device, "memory.used_bytes", &used));
    dev_u64(device, "memory.reserved_bytes", &reserved);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ENTER_DEVICE("nvmlDeviceGetPowerUsage", device);
    SUPPORTED(dev_uint(device, "power.usage_mw", power));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    ENTER_DEVICE("nvmlDeviceGetEnforcedPowerLimit", device);
    SUPPORTED(dev_uint(device, "power.enforced_limit_mw", limit));
    return NVML_SUCCESS;
}

/* invented counter: energy.at_init_mj plus power.usage_mw integrated since nvmlInit */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    ENTER_DEVICE("nvmlDeviceGetTotalEnergyConsumption", device);
    unsigned long long base, power;
    SUPPORTED(dev_u64(device, "energy.at_init_mj", &base) && dev_u64(device, "power.usage_mw", &power));
    *energy = base + (unsigned long long)((double)power * elapsed_s());
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    ENTER_DEVICE("nvmlDeviceGetTemperature", device);
    if (sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    SUPPORTED(dev_uint(device, "temperature.gpu_c", temp));
    return NVML_SUCCESS;
}

/* --- PCIe ----------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen) {
    ENTER_DEVICE("nvmlDeviceGetCurrPcieLinkGeneration", device);
    SUPPORTED(dev_uint(device, "pcie.generation", currLinkGen));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth) {
    ENTER_DEVICE("nvmlDeviceGetCurrPcieLinkWidth", device);
    SUPPORTED(dev_uint(device, "pcie.width", currLinkWidth));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen) {
    ENTER_DEVICE("nvmlDeviceGetMaxPcieLinkGeneration", device);
    SUPPORTED(dev_uint(device, "pcie.generation_max", maxLinkGen));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth) {
    ENTER_DEVICE("nvmlDeviceGetMaxPcieLinkWidth", device);
    SUPPORTED(dev_uint(device, "pcie.width_max", maxLinkWidth));
    return NVML_SUCCESS;
}

/* invented counters: pcie.tx/rx_bytes_per_s (from the capture's dmon rate) times the time since nvmlInit */
static int pcie_bytes(nvmlDevice_t device, int tx, unsigned long long *bytes) {
    double rate;
    if (!dev_double(device, tx ? "pcie.tx_bytes_per_s" : "pcie.rx_bytes_per_s", &rate)) return 0;
    *bytes = (unsigned long long)(rate * elapsed_s());
    return 1;
}

/* samples for 20 ms, as the driver does, and answers KB/s */
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value) {
    ENTER_DEVICE("nvmlDeviceGetPcieThroughput", device);
    if (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES) return NVML_ERROR_INVALID_ARGUMENT;
    double rate;
    SUPPORTED(dev_double(device, counter == NVML_PCIE_UTIL_TX_BYTES ? "pcie.tx_bytes_per_s" : "pcie.rx_bytes_per_s", &rate));
    sleep_s(0.02);
    *value = (unsigned int)(rate / 1024.0);
    return NVML_SUCCESS;
}

/* NVLink: nvlink.links (nvidia-smi nvlink -s's links); the data counters in KiB from
 * nvlink.tx/rx_bytes_per_s times the time since nvmlInit, summed over links for scopeId
 * UINT_MAX, a link's share otherwise; NOT_SUPPORTED without links and in MIG mode */
static void nvlink_field(nvmlDevice_t device, nvmlFieldValue_t *v) {
    unsigned int links = 0, mode = 0;
    if (device->mig >= 0 || (dev_uint(device, "mig.mode", &mode) && mode) || !dev_uint(device, "nvlink.links", &links)) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
    v->nvmlReturn = NVML_SUCCESS;
    if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = links;
        return;
    }
    if (v->scopeId != 0xFFFFFFFF && v->scopeId >= links) {
        v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return;
    }
    double rate = 0;
    dev_double(device, v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? "nvlink.tx_bytes_per_s" : "nvlink.rx_bytes_per_s", &rate);
    double kib = rate * elapsed_s() / 1024.0;
    if (v->scopeId != 0xFFFFFFFF && links) kib /= links;
    v->value.ullVal = (unsigned long long)kib;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    ENTER_DEVICE("nvmlDeviceGetFieldValues", device);
    if (valuesCount < 0 || (valuesCount > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        unsigned long long bytes;
        if (v->fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES || v->fieldId == NVML_FI_DEV_PCIE_COUNT_RX_BYTES) {
            if (FAKE_NVML_BRANCH < 555) {
                v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;  /* an id this driver does not know */
            } else if (pcie_bytes(device, v->fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES, &bytes)) {
                v->nvmlReturn = NVML_SUCCESS;
                /* as a real H200 on driver 580.159.04 answers: modulo 2^32 (the counter
                 * rose to 4.29e9 and began again; .devrun capture, docs/gpu-validation.md) */
                v->value.ullVal = bytes % 4294967296ULL;
            } else {
                v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            }
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT || v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ||
                   v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) {
            nvlink_field(device, v);
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* --- ECC ------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    ENTER_DEVICE("nvmlDeviceGetTotalEccErrors", device);
    const char *kind = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "corrected" : "uncorrected";
    const char *scope = counterType == NVML_VOLATILE_ECC ? "volatile" : "aggregate";
    char key[64];
    snprintf(key, sizeof key, "ecc.%s.%s", scope, kind);
    SUPPORTED(dev_u64(device, key, eccCounts));
    return NVML_SUCCESS;
}

/* --- processes ------------------------------------------------------------------------------- */

/* "pid:bytes pid:bytes" (bytes "-": NVML_VALUE_NOT_AVAILABLE) from processes.compute / .graphics */
static int list_processes(nvmlDevice_t device, const char *kind, unsigned int *pids, unsigned long long *used, int max) {
    char key[48];
    snprintf(key, sizeof key, "processes.%s", kind);
    const char *text = dev_get(device, key);
    if (!text) return 0;
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *item = strtok_r(copy, " ", &save); item && n < max; item = strtok_r(NULL, " ", &save)) {
        char *colon = strchr(item, ':');
        pids[n] = (unsigned int)strtoul(item, NULL, 10);
        used[n] = (colon && colon[1] != '-') ? strtoull(colon + 1, NULL, 10) : (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
        n++;
    }
    free(copy);
    return n;
}

/* the 32-byte record some drivers write into the caller's 24-byte nvmlProcessInfo_t array */
struct wide_process_record {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
};

static int mig_count(int gpu);

/* A MIG instance's handle lists its own processes; the parent's, in MIG mode, lists every
 * instance's with the instance's GPU and compute instance ids, as the driver does (to root). */
static int device_processes(nvmlDevice_t device, const char *kind, unsigned int *pids, unsigned long long *used,
                            unsigned int *gi, unsigned int *ci, int max) {
    unsigned int mode = 0;
    if (device->mig >= 0 || !dev_uint(device, "mig.mode", &mode) || !mode) {
        unsigned int g = 0xFFFFFFFF, c = 0xFFFFFFFF;
        if (device->mig >= 0) {
            dev_uint(device, "gpu_instance_id", &g);
            dev_uint(device, "compute_instance_id", &c);
        }
        int n = list_processes(device, kind, pids, used, max);
        for (int i = 0; i < n; i++) {
            gi[i] = g;
            ci[i] = c;
        }
        return n;
    }
    int n = 0;
    for (int m = 0; m < mig_count(device->gpu) && n < max; m++) {
        int k = device_processes(&migs[device->gpu][m], kind, pids + n, used + n, gi + n, ci + n, max - n);
        n += k;
    }
    return n;
}

static nvmlReturn_t processes(nvmlDevice_t device, const char *kind, int version, unsigned int *infoCount, void *infos) {
    unsigned int pids[64], gi[64], ci[64];
    unsigned long long used[64];
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    /* nvml.h: in MIG mode the parent's aggregate list needs privileges, an instance's does not */
    const char *unprivileged = knob("UNPRIVILEGED");
    unsigned int mode = 0;
    if (unprivileged && atoi(unprivileged) && device->mig < 0 && dev_uint(device, "mig.mode", &mode) && mode)
        return NVML_ERROR_NO_PERMISSION;
    int n = device_processes(device, kind, pids, used, gi, ci, 64);
    if (*infoCount < (unsigned int)n || (n > 0 && !infos)) {
        *infoCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    const char *stride = knob("PROCESS_STRIDE");
    int wide = version == 3 && stride && atoi(stride) == 32;
    for (int i = 0; i < n; i++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = pids[i];
            p->usedGpuMemory = used[i];
        } else if (wide) {
            struct wide_process_record *p = (struct wide_process_record *)infos + i;
            /* the caller sized for 24-byte records; past its end only while its array has room */
            if ((size_t)(i + 1) * sizeof *p > (size_t)*infoCount * sizeof(nvmlProcessInfo_t)) break;
            p->pid = pids[i];
            p->usedGpuMemory = used[i];
            p->gpuInstanceId = gi[i];
            p->computeInstanceId = ci[i];
            p->usedGpuCcProtectedMemory = 0;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
            p->pid = pids[i];
            p->usedGpuMemory = used[i];
            p->gpuInstanceId = gi[i];
            p->computeInstanceId = ci[i];
        }
    }
    *infoCount = (unsigned int)n;
    return NVML_SUCCESS;
}

#define PROCESS_FUNCTION(name, kind, version, type)                                      \
    EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, type *infos) { \
        ENTER_DEVICE(#name, device);                                                      \
        return processes(device, kind, version, infoCount, infos);                        \
    }

PROCESS_FUNCTION(nvmlDeviceGetComputeRunningProcesses, "compute", 1, nvmlProcessInfo_v1_t)
PROCESS_FUNCTION(nvmlDeviceGetComputeRunningProcesses_v2, "compute", 2, nvmlProcessInfo_v2_t)
PROCESS_FUNCTION(nvmlDeviceGetComputeRunningProcesses_v3, "compute", 3, nvmlProcessInfo_t)
PROCESS_FUNCTION(nvmlDeviceGetGraphicsRunningProcesses, "graphics", 1, nvmlProcessInfo_v1_t)
PROCESS_FUNCTION(nvmlDeviceGetGraphicsRunningProcesses_v2, "graphics", 2, nvmlProcessInfo_v2_t)
PROCESS_FUNCTION(nvmlDeviceGetGraphicsRunningProcesses_v3, "graphics", 3, nvmlProcessInfo_t)

PROCESS_FUNCTION(nvmlDeviceGetMPSComputeRunningProcesses, "mps", 1, nvmlProcessInfo_v1_t)
PROCESS_FUNCTION(nvmlDeviceGetMPSComputeRunningProcesses_v2, "mps", 2, nvmlProcessInfo_v2_t)
PROCESS_FUNCTION(nvmlDeviceGetMPSComputeRunningProcesses_v3, "mps", 3, nvmlProcessInfo_t)

/* --- sharing: compute mode, per-process utilisation ------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    ENTER_DEVICE("nvmlDeviceGetComputeMode", device);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int value;
    SUPPORTED(dev_uint(device, "compute_mode", &value));
    *mode = (nvmlComputeMode_t)value;
    return NVML_SUCCESS;
}

/* "pid:sm:mem ..." from processes.utilization (nvidia-smi pmon's sm and mem %): one sample
 * per process that ran a kernel, stamped now; NOT_FOUND when none is newer than
 * lastSeenTimeStamp, NOT_SUPPORTED in MIG mode (nvml.h's note) */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp) {
    ENTER_DEVICE("nvmlDeviceGetProcessUtilization", device);
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int mode = 0;
    SUPPORTED(device->mig < 0 && !(dev_uint(device, "mig.mode", &mode) && mode));
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long stamp = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000ULL;
    const char *text = dev_get(device, "processes.utilization");
    unsigned int pids[64], sm[64], mem[64];
    unsigned int n = 0;
    if (text && stamp > lastSeenTimeStamp) {
        char *copy = strdup(text), *save = NULL;
        for (char *item = strtok_r(copy, " ", &save); item && n < 64; item = strtok_r(NULL, " ", &save)) {
            if (sscanf(item, "%u:%u:%u", &pids[n], &sm[n], &mem[n]) == 3) n++;
        }
        free(copy);
    }
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        memset(&utilization[i], 0, sizeof utilization[i]);
        utilization[i].pid = pids[i];
        utilization[i].timeStamp = stamp;
        utilization[i].smUtil = sm[i];
        utilization[i].memUtil = mem[i];
    }
    *processSamplesCount = n;
    return NVML_SUCCESS;
}

/* --- MIG ------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    ENTER_DEVICE("nvmlDeviceGetMigMode", device);
    unsigned int mode;
    SUPPORTED(device->mig < 0 && dev_uint(device, "mig.mode", &mode));
    *currentMode = mode;
    *pendingMode = mode;
    return NVML_SUCCESS;
}

static int mig_count(int gpu) {
    int n = 0;
    while (n < MAX_MIG && dev_get(&migs[gpu][n], "uuid")) n++;
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    ENTER_DEVICE("nvmlDeviceGetMaxMigDeviceCount", device);
    if (device->mig >= 0 || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int mode = 0;
    /* nvml.h: "Returns zero if MIG is not supported or enabled"; Hopper: up to seven */
    *count = dev_uint(device, "mig.mode", &mode) && mode ? MAX_MIG - 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    ENTER_DEVICE("nvmlDeviceGetMigDeviceHandleByIndex", device);
    if (device->mig >= 0 || !migDevice || index >= MAX_MIG - 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int mode;
    SUPPORTED(dev_uint(device, "mig.mode", &mode));  /* a GPU without MIG (before Ampere) */
    if (!mode || (int)index >= mig_count(device->gpu)) return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[device->gpu][index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    ENTER_DEVICE("nvmlDeviceIsMigDeviceHandle", device);
    *isMigDevice = device->mig >= 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    ENTER_DEVICE("nvmlDeviceGetGpuInstanceId", device);
    SUPPORTED(device->mig >= 0 && dev_uint(device, "gpu_instance_id", id));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    ENTER_DEVICE("nvmlDeviceGetComputeInstanceId", device);
    SUPPORTED(device->mig >= 0 && dev_uint(device, "compute_instance_id", id));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    ENTER_DEVICE("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice);
    if (migDevice->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[migDevice->gpu];
    return NVML_SUCCESS;
}

/* --- events ---------------------------------------------------------------------------------- */

struct nvmlEventSet_st {
    int registered[MAX_GPUS];
    int delivered[MAX_RULES];  /* which XIDS rules this set has delivered */
};

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER("nvmlEventSetCreate");
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    ENTER_DEVICE("nvmlDeviceRegisterEvents", device);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long supported = 0;
    SUPPORTED(dev_u64(device, "events.supported", &supported) && (eventTypes & ~supported) == 0);
    set->registered[device->gpu] = 1;
    return NVML_SUCCESS;
}

static nvmlReturn_t event_wait(const char *function, nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    ENTER(function);
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = elapsed_s() + timeoutms / 1000.0;
    for (;;) {
        /* one GPU of the set lost: the whole set answers GPU_IS_LOST, as the driver does */
        for (int g = 0; g < gpu_count(); g++)
            if (set->registered[g] && gpu_is_lost(g)) return NVML_ERROR_GPU_IS_LOST;
        struct rule rules[MAX_RULES];
        int n = parse_rules(knob("XIDS"), rules, MAX_RULES);
        double now = elapsed_s();
        pthread_mutex_lock(&lock);
        for (int i = 0; i < n; i++) {
            int g = atoi(rules[i].head);
            if (g < 0 || g >= gpu_count() || !set->registered[g] || set->delivered[i] || now < rules[i].at_s) continue;
            set->delivered[i] = 1;
            pthread_mutex_unlock(&lock);
            memset(data, 0, sizeof *data);
            data->device = &gpus[g];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = strtoull(rules[i].error, NULL, 10);
            data->gpuInstanceId = 0xFFFFFFFF;
            data->computeInstanceId = 0xFFFFFFFF;
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&lock);
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        sleep_s(deadline - now < 0.01 ? deadline - now : 0.01);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return event_wait("nvmlEventSetWait_v2", set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return event_wait("nvmlEventSetWait", set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER("nvmlEventSetFree");
    free(set);
    return NVML_SUCCESS;
}

/* --- GPM (Hopper and newer) ------------------------------------------------------------------- */

struct nvmlGpmSample_st {
    int taken;
    int gpu;
    int mig;  /* -1: the device's sample; else the MIG device of the sampled GPU instance */
    double at_s;
};

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    ENTER_DEVICE("nvmlGpmQueryDeviceSupport", device);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int supported = 0;
    dev_uint(device, "gpm.supported", &supported);
    gpmSupport->isSupportedDevice = supported;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    ENTER("nvmlGpmSampleAlloc");
    if (!gpmSample) return NVML_ERROR_INVALID_ARGUMENT;
    *gpmSample = calloc(1, sizeof **gpmSample);
    return *gpmSample ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    ENTER("nvmlGpmSampleFree");
    if (!gpmSample) return NVML_ERROR_INVALID_ARGUMENT;
    free(gpmSample);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    ENTER_DEVICE("nvmlGpmSampleGet", device);
    if (!gpmSample) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int supported = 0;
    SUPPORTED(dev_uint(device, "gpm.supported", &supported) && supported);
    gpmSample->taken = 1;
    gpmSample->gpu = device->gpu;
    gpmSample->mig = -1;
    gpmSample->at_s = elapsed_s();
    return NVML_SUCCESS;
}

/* A GPU instance's sample, on the parent's handle (every branch the fake builds has it:
 * GPM came with it in R525). INVALID_ARGUMENT on a MIG handle, NOT_SUPPORTED without GPM
 * or MIG mode, NOT_FOUND for a GPU instance id no MIG device has. */
EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample) {
    ENTER_DEVICE("nvmlGpmMigSampleGet", device);
    if (!gpmSample || device->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int supported = 0, mode = 0;
    SUPPORTED(dev_uint(device, "gpm.supported", &supported) && supported);
    SUPPORTED(dev_uint(device, "mig.mode", &mode) && mode);
    for (int n = 0; n < MAX_MIG; n++) {
        unsigned int id;
        if (dev_uint(&migs[device->gpu][n], "gpu_instance_id", &id) && id == gpuInstanceId) {
            gpmSample->taken = 1;
            gpmSample->gpu = device->gpu;
            gpmSample->mig = n;
            gpmSample->at_s = elapsed_s();
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* A GPU instance's value of metric `key`: one of its MIG devices' own
 * (gpu.<i>.mig.<n>.gpm.<id>, the first of the instance's that has it), else the parent's
 * (an even load: every instance as busy as the GPU's average). PCIe is the parent's link:
 * NOT_SUPPORTED per instance. */
static int instance_value(int gpu, int mig, unsigned int metric, const char *key, double *out) {
    if (metric == NVML_GPM_METRIC_PCIE_TX_PER_SEC || metric == NVML_GPM_METRIC_PCIE_RX_PER_SEC)
        return 0;
    unsigned int gi = 0, id;
    dev_uint(&migs[gpu][mig], "gpu_instance_id", &gi);
    for (int n = 0; n < MAX_MIG; n++) {
        if (dev_uint(&migs[gpu][n], "gpu_instance_id", &id) && id == gi && dev_double(&migs[gpu][n], key, out))
            return 1;
    }
    return dev_double(&gpus[gpu], key, out);
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    ENTER("nvmlGpmMetricsGet");
    if (!metricsGet) return NVML_ERROR_INVALID_ARGUMENT;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t a = metricsGet->sample1, b = metricsGet->sample2;
    if (!a || !b || !a->taken || !b->taken || a->gpu != b->gpu || a->mig != b->mig || b->at_s <= a->at_s ||
        metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_is_lost(a->gpu)) return NVML_ERROR_GPU_IS_LOST;
    const char *nan = knob("GPM_NAN");
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        char key[48];
        snprintf(key, sizeof key, "gpm.%u", m->metricId);
        double percent;
        int found = a->mig < 0 ? dev_double(&gpus[a->gpu], key, &percent)
                               : instance_value(a->gpu, a->mig, m->metricId, key, &percent);
        if (found) {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = (nan && atoi(nan)) ? NAN : percent;
        } else {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}
