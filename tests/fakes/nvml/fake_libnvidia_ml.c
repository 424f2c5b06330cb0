/*
 * A fake libnvidia-ml.so.1 for tests: the C ABI of the NVML functions the agent's paths reach, with
 * NVML's signatures, struct layouts (nvmlPciInfo_t, nvmlFieldValue_t, nvmlGpuFabricInfo_v2_t ...) and
 * return codes, loaded by the real pynvml (nvidia-ml-py) exactly as it loads the real library.
 * Written for gpu-healthcheck; no NVIDIA code. Built by tests/conftest.py with gcc (soname
 * libnvidia-ml.so.1).
 *
 * What it models, as NVML does:
 *  - nvmlInit is reference-counted: every nvmlInitWithFlags/nvmlInit_v2 adds one, nvmlShutdown takes
 *    one away; at zero the library is uninitialised and every call answers NVML_ERROR_UNINITIALIZED;
 *  - GPUs are attached on their first nvmlDeviceGetHandleByIndex after an initialisation (nvmlInit_v2
 *    attaches none); handles from before the library went to zero answer UNINITIALIZED;
 *  - nvmlDeviceGetFieldValues fills nvmlReturn per entry (fields scoped by scopeId = link number);
 *  - the device list and every value come from a text file (FAKE_NVML_CONFIG, read when the library
 *    goes from zero to one reference, or on fake_nvml_load): "driver V", "cuda N", "init_error N", then
 *    per GPU a line "gpu" followed by "key value" lines (tests/fakes/nvml/fake_nvml.py writes them).
 *    A value "!N" makes that getter return NVML error N; a key that is absent answers NOT_SUPPORTED.
 *    "hang_while PATH": every call on that GPU waits while the file PATH exists (a hung GPU that a
 *    test in another process holds and releases).
 *
 * fake_nvml_* functions let the tests read the counts of inits, shutdowns and attaches, hold every
 * call (a hung driver) or every call on one GPU (a hung GPU), drop the library's initialisation
 * (UNINITIALIZED), and reload the file.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    OK = 0, E_UNINITIALIZED = 1, E_INVALID_ARGUMENT = 2, E_NOT_SUPPORTED = 3, E_INSUFFICIENT_SIZE = 7,
    E_LIBRARY_NOT_FOUND = 12, E_GPU_IS_LOST = 15, E_ARGUMENT_VERSION_MISMATCH = 25, E_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_KEYS 400
typedef struct { char key[48]; char value[96]; } kv_t;
typedef struct {
    int index;
    unsigned attached_gen; /* the library generation it was attached in (0: never) */
    int nkeys;
    kv_t kv[MAX_KEYS];
} device_t;

typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_info_t;
typedef union { double dVal; unsigned uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; int siVal; unsigned short usVal; } value_t;
typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec; unsigned valueType, nvmlReturn; value_t value; } field_value_t;
typedef struct { unsigned version; unsigned char clusterUuid[16]; unsigned status, cliqueId, state, healthMask; } fabric_v2_t;
typedef struct { unsigned gpu, memory; } utilization_t;
typedef struct { unsigned max, high, partial, low, none; } remap_histogram_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static device_t devices[MAX_GPUS];
static int ndevices;
static char driver[80] = "580.159.04";
static int cuda = 13000, init_error;
static unsigned refcount, generation = 1, holding;
static unsigned char holding_gpu[MAX_GPUS]; /* calls on this GPU (and its attach) are held */
static unsigned inits, shutdowns, attaches, handle_calls, calls;

/* ------------------------------------------------------------------ the configuration file */
static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

static int load_locked(const char *path) {
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[256];
    if (!f) return -1;
    ndevices = 0;
    init_error = 0;
    device_t *d = NULL;
    while (fgets(line, sizeof line, f)) {
        trim(line);
        if (!line[0] || line[0] == '#') continue;
        char *value = strchr(line, ' ');
        if (value) *value++ = 0; else value = line + strlen(line);
        if (!strcmp(line, "gpu")) {
            if (ndevices == MAX_GPUS) break;
            d = &devices[ndevices];
            unsigned keep = d->attached_gen;
            memset(d, 0, sizeof *d);
            d->attached_gen = keep; /* a reload keeps what is attached */
            d->index = ndevices++;
        } else if (!d) {
            if (!strcmp(line, "driver")) strncpy(driver, value, sizeof driver - 1);
            else if (!strcmp(line, "cuda")) cuda = atoi(value);
            else if (!strcmp(line, "init_error")) init_error = atoi(value);
        } else if (d->nkeys < MAX_KEYS) {
            strncpy(d->kv[d->nkeys].key, line, sizeof d->kv[0].key - 1);
            strncpy(d->kv[d->nkeys].value, value, sizeof d->kv[0].value - 1);
            d->nkeys++;
        }
    }
    fclose(f);
    return 0;
}

static const char *lookup(const device_t *d, const char *key) {
    for (int i = 0; i < d->nkeys; i++)
        if (!strcmp(d->kv[i].key, key)) return d->kv[i].value;
    return NULL;
}

/* The value of key: OK with *out set, NOT_SUPPORTED when absent, N for "!N". */
static int value_of(const device_t *d, const char *key, const char **out) {
    const char *v = lookup(d, key);
    if (!v) return E_NOT_SUPPORTED;
    if (v[0] == '!') return atoi(v + 1);
    *out = v;
    return OK;
}

static int get_ull(const device_t *d, const char *key, unsigned long long *out) {
    const char *v;
    int rc = value_of(d, key, &v);
    if (rc == OK) *out = strtoull(v, NULL, 0);
    return rc;
}

static int get_uint(const device_t *d, const char *key, unsigned *out) {
    unsigned long long v = 0;
    int rc = get_ull(d, key, &v);
    if (rc == OK) *out = (unsigned)v;
    return rc;
}

static int get_uints(const device_t *d, const char *key, unsigned *out, int n) {
    const char *v;
    int rc = value_of(d, key, &v);
    for (int i = 0; rc == OK && i < n; i++) {
        char *end;
        out[i] = (unsigned)strtoul(v, &end, 0);
        v = end;
    }
    return rc;
}

static int get_text(const device_t *d, const char *key, char *buf, unsigned len) {
    const char *v;
    int rc = value_of(d, key, &v);
    if (rc != OK) return rc;
    if (strlen(v) + 1 > len) return E_INSUFFICIENT_SIZE;
    strcpy(buf, v);
    return OK;
}

/* ------------------------------------------------------------------ entry checks */
/* Every device call: counted, held while the test holds GPUs, refused when uninitialised or stale. */
static int held(const device_t *d) {
    return holding || (d && d >= devices && d < devices + MAX_GPUS && holding_gpu[d - devices]);
}

/* A GPU whose file key "hang_while PATH" names a file that exists: its calls wait (with the lock
 * released) until the file is gone. Another process (a test driving an agent process) holds it. */
static void wait_file(const device_t *d) {
    const char *path = d ? lookup(d, "hang_while") : NULL;
    while (path && access(path, F_OK) == 0) {
        pthread_mutex_unlock(&lock);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&lock);
    }
}

static int enter(const device_t *d) {
    pthread_mutex_lock(&lock);
    calls++;
    while (held(d)) pthread_cond_wait(&released, &lock);
    if (d >= devices && d < devices + ndevices) wait_file(d);
    int rc = OK;
    if (!refcount) rc = E_UNINITIALIZED;
    else if (d && (d < devices || d >= devices + ndevices)) rc = E_INVALID_ARGUMENT;
    else if (d && d->attached_gen != generation) rc = E_UNINITIALIZED;
    else if (d) {
        const char *lost = lookup(d, "lost");
        if (lost) rc = atoi(lost);
    }
    if (rc != OK) pthread_mutex_unlock(&lock);
    return rc;
}
#define ENTER(dev) do { int _rc = enter(dev); if (_rc != OK) return _rc; } while (0)
#define LEAVE(rc) do { int _r = (rc); pthread_mutex_unlock(&lock); return _r; } while (0)

/* ------------------------------------------------------------------ library */
int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!refcount) {
        if (load_locked(getenv("FAKE_NVML_CONFIG")) != 0) { pthread_mutex_unlock(&lock); return E_LIBRARY_NOT_FOUND; }
        if (init_error) { int rc = init_error; pthread_mutex_unlock(&lock); return rc; }
    }
    refcount++;
    inits++;
    pthread_mutex_unlock(&lock);
    return OK;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (!refcount) { pthread_mutex_unlock(&lock); return E_UNINITIALIZED; }
    shutdowns++;
    if (--refcount == 0) generation++; /* every handle goes stale */
    pthread_mutex_unlock(&lock);
    return OK;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case E_UNINITIALIZED: return "Uninitialized";
    case E_INVALID_ARGUMENT: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case E_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case E_GPU_IS_LOST: return "GPU is lost";
    case 16: return "GPU requires reset";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned length) {
    ENTER(NULL);
    if (strlen(driver) + 1 > length) LEAVE(E_INSUFFICIENT_SIZE);
    strcpy(version, driver);
    LEAVE(OK);
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER(NULL);
    *version = cuda;
    LEAVE(OK);
}

int nvmlDeviceGetCount_v2(unsigned *count) {
    ENTER(NULL);
    *count = (unsigned)ndevices;
    LEAVE(OK);
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, device_t **device) {
    pthread_mutex_lock(&lock); /* as ENTER(NULL), and attaching a hung GPU hangs too */
    calls++;
    while (holding || (index < MAX_GPUS && holding_gpu[index])) pthread_cond_wait(&released, &lock);
    if (index < (unsigned)ndevices) wait_file(&devices[index]);
    if (!refcount) LEAVE(E_UNINITIALIZED);
    handle_calls++;
    if (index >= (unsigned)ndevices) LEAVE(E_INVALID_ARGUMENT);
    device_t *d = &devices[index];
    const char *err = lookup(d, "handle_error");
    if (err) LEAVE(atoi(err));
    if (d->attached_gen != generation) {
        d->attached_gen = generation;
        attaches++;
    }
    *device = d;
    LEAVE(OK);
}

/* ------------------------------------------------------------------ identity */
#define TEXT_GETTER(fn, key) \
    int fn(device_t *d, char *buf, unsigned length) { ENTER(d); LEAVE(get_text(d, key, buf, length)); }
TEXT_GETTER(nvmlDeviceGetName, "name")
TEXT_GETTER(nvmlDeviceGetUUID, "uuid")
TEXT_GETTER(nvmlDeviceGetSerial, "serial")

static int pci_of(const device_t *d, const char *key, pci_info_t *info) {
    const char *v;
    int rc = value_of(d, key, &v);
    if (rc != OK) return rc;
    memset(info, 0, sizeof *info);
    strncpy(info->busId, v, sizeof info->busId - 1);
    strncpy(info->busIdLegacy, v + (strlen(v) > 12 ? 4 : 0), sizeof info->busIdLegacy - 1);
    sscanf(v, "%x:%x:%x", &info->domain, &info->bus, &info->device);
    return OK;
}

int nvmlDeviceGetPciInfo_v3(device_t *d, pci_info_t *info) { ENTER(d); LEAVE(pci_of(d, "pci", info)); }

/* ------------------------------------------------------------------ plain unsigned getters */
#define UINT_GETTER(fn, key) int fn(device_t *d, unsigned *out) { ENTER(d); LEAVE(get_uint(d, key, out)); }
UINT_GETTER(nvmlDeviceGetArchitecture, "arch")
UINT_GETTER(nvmlDeviceGetPersistenceMode, "persistence")
UINT_GETTER(nvmlDeviceGetRetiredPagesPendingStatus, "retired_pending")
UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, "pcie_gen_cur")
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, "pcie_gen_max")
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, "pcie_width_cur")
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, "pcie_width_max")
UINT_GETTER(nvmlDeviceGetPcieReplayCounter, "pcie_replay")
UINT_GETTER(nvmlDeviceGetPerformanceState, "pstate")
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, "power_limit")
UINT_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, "power_default")
UINT_GETTER(nvmlDeviceGetPowerUsage, "power_usage")

/* Compute processes (the DCGM diag's idle gate asks): none on this machine; no recording lists one. */
int nvmlDeviceGetComputeRunningProcesses_v3(device_t *d, unsigned *count, void *infos) {
    (void)infos;
    ENTER(d);
    *count = 0;
    LEAVE(OK);
}

int nvmlDeviceGetCurrentClocksEventReasons(device_t *d, unsigned long long *out) {
    ENTER(d);
    LEAVE(get_ull(d, "clock_reasons", out));
}

#define PAIR_GETTER(fn, key) \
    int fn(device_t *d, unsigned *current, unsigned *pending) { \
        unsigned v[2]; ENTER(d); int rc = get_uints(d, key, v, 2); \
        if (rc == OK) { *current = v[0]; *pending = v[1]; } LEAVE(rc); }
PAIR_GETTER(nvmlDeviceGetMigMode, "mig")
PAIR_GETTER(nvmlDeviceGetEccMode, "ecc")

/* Getters with one argument: key "<name>.<arg>". */
#define ARG_GETTER(fn, name) \
    int fn(device_t *d, unsigned arg, unsigned *out) { \
        char key[48]; ENTER(d); snprintf(key, sizeof key, name ".%u", arg); LEAVE(get_uint(d, key, out)); }
ARG_GETTER(nvmlDeviceGetTemperature, "temp")
ARG_GETTER(nvmlDeviceGetTemperatureThreshold, "temp_threshold")
ARG_GETTER(nvmlDeviceGetApplicationsClock, "app_clock")
ARG_GETTER(nvmlDeviceGetDefaultApplicationsClock, "default_app_clock")
ARG_GETTER(nvmlDeviceGetClockInfo, "clock")
ARG_GETTER(nvmlDeviceGetMaxClockInfo, "max_clock")
ARG_GETTER(nvmlDeviceGetNvLinkRemoteDeviceType, "nvlink_remote_type")

int nvmlDeviceGetNvLinkState(device_t *d, unsigned link, unsigned *active) {
    char key[48];
    ENTER(d);
    snprintf(key, sizeof key, "field.165.%u", link);
    LEAVE(get_uint(d, key, active));
}

int nvmlDeviceGetNvLinkErrorCounter(device_t *d, unsigned link, unsigned counter, unsigned long long *out) {
    char key[48];
    ENTER(d);
    snprintf(key, sizeof key, "nvlink_err.%u.%u", link, counter);
    LEAVE(get_ull(d, key, out));
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(device_t *d, unsigned link, pci_info_t *info) {
    char key[48];
    ENTER(d);
    snprintf(key, sizeof key, "nvlink_remote_pci.%u", link);
    LEAVE(pci_of(d, key, info));
}

/* ------------------------------------------------------------------ memory errors */
int nvmlDeviceGetMemoryErrorCounter(device_t *d, unsigned err, unsigned counter, unsigned loc, unsigned long long *out) {
    char key[48];
    ENTER(d);
    snprintf(key, sizeof key, "memerr.%u.%u.%u", err, counter, loc);
    LEAVE(get_ull(d, key, out));
}

int nvmlDeviceGetTotalEccErrors(device_t *d, unsigned err, unsigned counter, unsigned long long *out) {
    char key[48];
    ENTER(d);
    snprintf(key, sizeof key, "totalecc.%u.%u", err, counter);
    LEAVE(get_ull(d, key, out));
}

int nvmlDeviceGetRetiredPages(device_t *d, unsigned cause, unsigned *count, unsigned long long *addresses) {
    char key[48];
    unsigned n = 0;
    ENTER(d);
    snprintf(key, sizeof key, "retired.%u", cause);
    int rc = get_uint(d, key, &n);
    if (rc != OK) LEAVE(rc);
    if (!addresses || *count < n) { *count = n; LEAVE(n ? E_INSUFFICIENT_SIZE : OK); }
    for (unsigned i = 0; i < n; i++) addresses[i] = 0x1000ull * (i + 1);
    *count = n;
    LEAVE(OK);
}

int nvmlDeviceGetRemappedRows(device_t *d, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *failure) {
    unsigned v[4];
    ENTER(d);
    int rc = get_uints(d, "remapped", v, 4);
    if (rc == OK) { *corr = v[0]; *unc = v[1]; *pending = v[2]; *failure = v[3]; }
    LEAVE(rc);
}

int nvmlDeviceGetRowRemapperHistogram(device_t *d, remap_histogram_t *h) {
    unsigned v[5];
    ENTER(d);
    int rc = get_uints(d, "remap_hist", v, 5);
    if (rc == OK) { h->max = v[0]; h->high = v[1]; h->partial = v[2]; h->low = v[3]; h->none = v[4]; }
    LEAVE(rc);
}

int nvmlDeviceGetUtilizationRates(device_t *d, utilization_t *u) {
    unsigned v[2];
    ENTER(d);
    int rc = get_uints(d, "util", v, 2);
    if (rc == OK) { u->gpu = v[0]; u->memory = v[1]; }
    LEAVE(rc);
}

int nvmlDeviceGetGpuFabricInfoV(device_t *d, fabric_v2_t *info) {
    unsigned v[2];
    ENTER(d);
    if (info->version != ((unsigned)sizeof(fabric_v2_t) | (2u << 24))) LEAVE(E_ARGUMENT_VERSION_MISMATCH);
    int rc = get_uints(d, "fabric", v, 2);
    if (rc == OK) { info->state = v[0]; info->status = v[1]; }
    LEAVE(rc);
}

/* ------------------------------------------------------------------ field values */
int nvmlDeviceGetFieldValues(device_t *d, int count, field_value_t *values) {
    char key[48];
    ENTER(d);
    if (count < 0) LEAVE(E_INVALID_ARGUMENT);
    const char *whole = lookup(d, "field_values_error");
    if (whole) LEAVE(atoi(whole));
    for (int i = 0; i < count; i++) {
        field_value_t *fv = &values[i];
        unsigned long long v = 0;
        snprintf(key, sizeof key, "field.%u.%u", fv->fieldId, fv->scopeId);
        int rc = get_ull(d, key, &v);
        if (rc == E_NOT_SUPPORTED) {
            snprintf(key, sizeof key, "field.%u", fv->fieldId);
            rc = get_ull(d, key, &v);
        }
        fv->nvmlReturn = (unsigned)rc;
        fv->valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
        fv->value.ullVal = 0;
        fv->value.uiVal = (unsigned)v;
        fv->timestamp = 0;
        fv->latencyUsec = 0;
    }
    LEAVE(OK);
}

/* ------------------------------------------------------------------ topology and affinity */
int nvmlDeviceGetTopologyCommonAncestor(device_t *a, device_t *b, unsigned *level) {
    char key[48];
    ENTER(a);
    if (b < devices || b >= devices + ndevices) LEAVE(E_INVALID_ARGUMENT);
    snprintf(key, sizeof key, "topo.%d", b->index);
    LEAVE(get_uint(a, key, level));
}

static int mask_of(const device_t *d, const char *key, unsigned size, unsigned long *set) {
    const char *v;
    int rc = value_of(d, key, &v);
    if (rc != OK) return rc;
    for (unsigned i = 0; i < size; i++) {
        char *end;
        set[i] = strtoul(v, &end, 16);
        v = end;
    }
    return OK;
}

int nvmlDeviceGetCpuAffinity(device_t *d, unsigned size, unsigned long *set) {
    ENTER(d);
    LEAVE(mask_of(d, "cpuset", size, set));
}

int nvmlDeviceGetMemoryAffinity(device_t *d, unsigned size, unsigned long *set, unsigned scope) {
    ENTER(d);
    LEAVE(scope == 0 ? mask_of(d, "nodeset", size, set) : E_NOT_SUPPORTED);
}

/* ------------------------------------------------------------------ the tests' controls */
void fake_nvml_counts(unsigned out[6]) {
    pthread_mutex_lock(&lock);
    out[0] = inits; out[1] = shutdowns; out[2] = attaches; out[3] = handle_calls; out[4] = calls; out[5] = refcount;
    pthread_mutex_unlock(&lock);
}

/* Forget every reference and count (between tests). */
void fake_nvml_reset(void) {
    pthread_mutex_lock(&lock);
    inits = shutdowns = attaches = handle_calls = calls = 0;
    refcount = 0;
    generation++;
    holding = 0;
    memset(holding_gpu, 0, sizeof holding_gpu);
    pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&lock);
}

/* Read the file again now (a changed driver version, a GPU gone); keeps the references. */
int fake_nvml_load(const char *path) {
    pthread_mutex_lock(&lock);
    int rc = load_locked(path);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* The library loses its initialisation: every call answers UNINITIALIZED until nvmlInit. */
void fake_nvml_uninitialise(void) {
    pthread_mutex_lock(&lock);
    refcount = 0;
    generation++;
    pthread_mutex_unlock(&lock);
}

/* Hold (1) or release (0) every call on one GPU, its attach included: one hung GPU. */
void fake_nvml_hold_gpu(int index, int on) {
    pthread_mutex_lock(&lock);
    if (index >= 0 && index < MAX_GPUS) holding_gpu[index] = (unsigned char)on;
    if (!on) pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&lock);
}

/* Hold (1) or release (0) every call that enters the library: a hung GPU or driver. */
void fake_nvml_hold(int on) {
    pthread_mutex_lock(&lock);
    holding = (unsigned)on;
    if (!on) pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&lock);
}
