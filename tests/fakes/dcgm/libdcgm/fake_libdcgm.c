/*
 * A fake libdcgm.so.4 for tests: the C ABI of DCGM 4.6's client library (the functions the project's
 * paths reach, with DCGM's struct layouts and version words) in front of a small in-process "engine".
 * Written for gpu-healthcheck from the behaviour notes (../shared/reference/dcgm-4.6-behaviour.md);
 * no NVIDIA code. Built by tests/conftest.py with gcc (soname libdcgm.so.4), loaded by our own
 * binding mirror (the .py files of tests/fakes/dcgm) exactly as DCGM's bindings load the real one.
 *
 * What it models, as DCGM 4.6 does:
 *  - handles and group ids are pointer-sized (dcgmHandle_t, dcgmGpuGrp_t = uintptr_t);
 *  - every struct's version word is checked (DCGM_ST_VER_MISMATCH otherwise);
 *  - connect retries every 50 ms up to timeoutMs (0 = 5000) and then answers CONNECTION_NOT_VALID;
 *    it succeeds only for the address the engine listens on (tcp port or unix socket path);
 *  - one engine-wide group table of DCGM_MAX_NUM_GROUPS (64), two of them the default groups, shared
 *    by all connections; a group lives until destroyed or its (non-persistent) connection closes;
 *  - an engine restart invalidates every connection and forgets groups, watches, samples, Xids;
 *  - health watches judge injected samples like DcgmHealthWatch.cpp: volatile DBE, row-remap failure
 *    and uncorrectable row remaps (latest sample), PCIe replays / thermal violation / NVLink recovery
 *    (first sample of the last 60 s against the latest), Xids (devastating ones always, system ALL);
 *    field 396 (row remap pending) is not watched;
 *  - dcgmGetDeviceAttributes names a GPU's PCI address (fake_set_gpu_pci; "" unless set), BADPARAM
 *    for a GPU id the engine does not have (fake_set_entities decides which it has);
 *  - a diag answers a response set by the test, can be held, honours the client-side timeout
 *    (DCGM_ST_TIMEOUT while the engine keeps running it: DIAG_ALREADY_RUNNING until it ends), and with
 *    the heartbeat flag is aborted when heartbeats stop or its connection closes;
 *  - every request waits for its answer at most the client's request timeout (60 s, DcgmModuleApi.h)
 *    and then answers DCGM_ST_TIMEOUT; a connect waits at most its timeoutMs (CONNECTION_NOT_VALID).
 *    Where the answer comes from can be made a process: fake_engine_process(path) sends each request
 *    through a Unix socket to a process that echoes it (tests/fakes/dcgm/engine_process.py), so that
 *    stopping that process (SIGSTOP) wedges every call and SIGCONT answers them; killing it is an
 *    engine that died (CONNECTION_NOT_VALID). fake_block(fn, 1) makes one API function wait the same
 *    way (an engine stuck in one operation) until fake_block(fn, 0); fake_block(fn, 2) past every
 *    timeout (a call stuck in a wedged driver). dcgmDisconnect is the client's own: it never waits
 *    for the engine.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef uintptr_t dcgmHandle_t;
typedef uintptr_t dcgmGpuGrp_t;

#define VERSION_OF(type, v) ((unsigned int)(sizeof(type) | ((unsigned int)(v) << 24)))

enum {
    ST_OK = 0, ST_BADPARAM = -1, ST_GENERIC_ERROR = -3, ST_NOT_CONFIGURED = -5, ST_TIMEOUT = -11,
    ST_VER_MISMATCH = -12, ST_UNKNOWN_FIELD = -13, ST_CONNECTION_NOT_VALID = -21, ST_MAX_LIMIT = -24,
    ST_INSUFFICIENT_SIZE = -31, ST_DIAG_ALREADY_RUNNING = -39, ST_DIAG_STOPPED = -66,
};

/* ------------------------------------------------------------------ structs (dcgm_structs.h 4.6) */
typedef struct { unsigned int version, persistAfterDisconnect, timeoutMs; } connect_v3_t;
typedef struct { uint32_t entityGroupId, entityId; } pair_t;
typedef struct {
    uint32_t version; dcgmGpuGrp_t groupId; uint32_t systems; int64_t updateInterval; double maxKeepAge;
} health_set_v2_t;
typedef struct { char msg[1024]; unsigned int code; } err_detail_t;
typedef struct { unsigned int system; uint32_t health; err_detail_t error; pair_t entityInfo; } incident_t;
typedef struct { uint32_t version, overallHealth, incidentCount; incident_t incidents[1024]; } health_v5_t;

typedef struct {
    unsigned int version, flags, debugLevel; dcgmGpuGrp_t groupId; unsigned int validate;
    char testNames[20][50]; char testParms[100][1050]; char fakeGpuList[50]; char debugLogFile[128];
    char statsPath[128]; char configFileContents[10000]; char clocksEventMask[50]; char pluginPath[128];
    unsigned int currentIterations, totalIterations, timeoutSeconds; char _unusedBuf[128];
    unsigned int failCheckInterval; char expectedNumEntities[50]; char entityIds[2048];
    unsigned int watchFrequency; char ignoreErrorCodes[512];
} run_diag_v10_t;

typedef struct { unsigned int version; char data[2048]; } aux_t;
typedef struct {
    char name[32]; char pluginName[32]; unsigned int result;
    uint8_t numErrors, numInfo, categoryIndex, _unused; uint16_t numResults;
    uint8_t errorIndices[32]; uint8_t infoIndices[128]; uint16_t resultIndices[1024]; aux_t auxData;
} test_run_v2_t;
typedef struct { pair_t entity; char serialNum[256]; char skuDeviceId[5]; } diag_entity_t;
typedef struct { pair_t entity; unsigned int code, category, severity; char msg[512]; unsigned int testId; } diag_error_t;
typedef struct { pair_t entity; char msg[512]; unsigned int testId; } diag_info_t;
typedef struct { pair_t entity; int32_t result; unsigned int testId; } diag_result_t;
typedef struct {
    unsigned int version; uint8_t numTests, numErrors, numInfo, numCategories; uint16_t numEntities, numResults;
    test_run_v2_t tests[20]; diag_entity_t entities[1024]; diag_error_t errors[32]; diag_info_t info[128];
    diag_result_t results[20 * 1024]; char categories[5][20]; char dcgmVersion[12]; char dcgmDriverVersion[256];
    char _unused[621952];
} diag_v12_t;

typedef struct {
    unsigned int version; uint16_t fieldId; uint16_t fieldType; int status; int64_t ts;
    union { int64_t i64; double dbl; char str[256]; char blob[4096]; } value;
} field_value_v1_t;

/* dcgmDeviceAttributes_v3: supported clocks, thermals, power limits, identifiers, memory, settings */
typedef struct { unsigned int version, memClock, smClock; } clock_set_t;
typedef struct {
    unsigned int version;
    struct { unsigned int version, count; clock_set_t clockSet[256]; } clockSets;
    struct { unsigned int version, slowdownTemp, shutdownTemp; } thermalSettings;
    struct { unsigned int version, cur, def, enforced, min, max; } powerLimits;
    struct {
        unsigned int version; char brandName[256], deviceName[256], pciBusId[256], serial[256], uuid[256];
        char vbios[256], inforomImageVersion[256]; uint32_t pciDeviceId, pciSubSystemId;
        char driverVersion[256]; uint32_t virtualizationMode;
    } identifiers;
    struct { unsigned int version, bar1Total, fbTotal, fbUsed, fbFree; } memoryUsage;
    struct { unsigned int version, persistenceModeEnabled, migModeEnabled, confidentialComputeMode; } settings;
} device_attributes_v3_t;

#define CONNECT_V3_VERSION VERSION_OF(connect_v3_t, 1)
#define HEALTH_SET_V2_VERSION VERSION_OF(health_set_v2_t, 2)
#define HEALTH_V5_VERSION VERSION_OF(health_v5_t, 5)
#define RUN_DIAG_V10_VERSION VERSION_OF(run_diag_v10_t, 10)
#define DIAG_V12_VERSION VERSION_OF(diag_v12_t, 12)
#define FIELD_VALUE_V1_VERSION VERSION_OF(field_value_v1_t, 1)
#define DEVICE_ATTRIBUTES_V3_VERSION VERSION_OF(device_attributes_v3_t, 3)

/* ------------------------------------------------------------------ engine state */
#define MAX_CONNS 4096
#define MAX_GROUPS 64             /* DCGM_MAX_NUM_GROUPS, engine-wide */
#define DEFAULT_GROUPS 2          /* DCGM_ALL_SUPPORTED_GPUS, DCGM_ALL_SUPPORTED_NVSWITCHES */
#define MAX_GPUS 16
#define MAX_SAMPLES 64
#define MAX_EXTRA 64
#define FE_GPU 1
#define FE_SWITCH 3
#define HW_PCIE 0x1u
#define HW_NVLINK 0x2u
#define HW_MEM 0x10u
#define HW_THERMAL 0x80u
#define HW_ALL 0xFFFFFFFFu
#define RESULT_WARN 10u
#define RESULT_FAIL 20u
#define FLAG_HEARTBEAT 0x20u

typedef struct { int open; unsigned generation; int persist; } conn_t;
typedef struct {
    int used; unsigned id; unsigned owner; unsigned systems; int64_t interval; double keep_age;
    int n; pair_t members[1024];
} group_t;
typedef struct { int64_t ts; int64_t v; } sample_t;
typedef struct { int n; sample_t s[MAX_SAMPLES]; } series_t;
typedef struct { unsigned group, id, system, health, code; char msg[256]; } extra_t;

/* the watched fields (DCGM_FI_DEV_*, all int64) */
static const unsigned short FIELDS[] = {230, 311, 396, 439, 241, 202, 395, 393};
#define NFIELDS (sizeof(FIELDS) / sizeof(FIELDS[0]))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int up = 1;
static unsigned generation = 1;
static char listen_kind[8] = "tcp";
static char listen_where[256] = "5555";
static conn_t conns[MAX_CONNS];
static unsigned next_conn = 1;
static group_t groups[MAX_GROUPS];
static int num_groups = DEFAULT_GROUPS;
static unsigned next_group = DEFAULT_GROUPS;
static unsigned gpu_ids[1024], switch_ids[1024];
static int n_gpus = 2, n_switches = 0;
static char gpu_pci[MAX_GPUS][64]; /* the PCI address dcgmGetDeviceAttributes names per GPU id ("": none set) */
static series_t samples[MAX_GPUS][NFIELDS];
static unsigned char xid_seen[MAX_GPUS][256];
static extra_t extra[MAX_EXTRA];
static int n_extra = 0;
static char fail_fn[8][64];
static int fail_code[8];
static diag_v12_t *diag_answer = NULL;
static int diag_error = 0;
static char diag_error_msg[512];
static int diag_hold = 0, diag_running = 0, diag_flags = 0;
static unsigned diag_conn = 0;
static int64_t last_beat_us = 0, heartbeat_timeout_ms = 600000;
/* what the tests read back */
static long long st_connects, st_groups_created, st_groups_destroyed, st_heartbeats, st_diag_calls;
static long long st_health_sets, st_health_checks, st_injections, st_connect_timeout, st_connect_persist;
static long long st_health_systems, st_health_interval, st_diag_validate, st_diag_flags, st_diag_timeout;
static double st_health_keep_age;
static char st_connect_address[512], st_diag_entities[2048], st_diag_tests[64];
static char engine_path[108] = ""; /* "" = the answer comes from this library */
static int64_t request_timeout_ms = 60000;
static char block_fn[8][64];
static int block_on[8];
static long long st_waiting, st_request_timeouts;
static field_value_v1_t injected[256];
static unsigned injected_gpu[256];
static int n_injected = 0;

static int64_t now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One request to the engine process and its answer, within timeout_ms: ST_OK, ST_TIMEOUT (no answer
 * in time) or ST_CONNECTION_NOT_VALID (no process listening, or it closed the connection). */
static int engine_round_trip(const char *path, int64_t timeout_ms) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ST_CONNECTION_NOT_VALID;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    char byte = 'q';
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || write(fd, &byte, 1) != 1) {
        close(fd);
        return ST_CONNECTION_NOT_VALID;
    }
    int64_t deadline = now_us() + timeout_ms * 1000;
    for (;;) {
        int64_t left_ms = (deadline - now_us()) / 1000;
        if (left_ms <= 0) {
            close(fd);
            return ST_TIMEOUT;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int n = poll(&p, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) continue;
        int rc = (n > 0 && read(fd, &byte, 1) == 1) ? ST_OK : ST_CONNECTION_NOT_VALID;
        close(fd);
        return rc;
    }
}

/* 0, or how `fn` is blocked: 1 until the request's timeout, 2 past every timeout (a wedged driver) */
static int blocked(const char *fn) {
    for (int i = 0; i < 8; i++)
        if (block_on[i] && strcmp(fn, block_fn[i]) == 0) return block_on[i];
    return 0;
}

/* The engine answers `fn` (ST_OK), or not within timeout_ms (ST_TIMEOUT), or is gone. Called before
 * the function takes the engine's lock: a call that waits holds nothing. */
static int engine_answers(const char *fn, int64_t timeout_ms) {
    int64_t deadline = now_us() + timeout_ms * 1000;
    char path[sizeof engine_path];
    pthread_mutex_lock(&mu);
    st_waiting++;
    while (blocked(fn) == 2 || (blocked(fn) && now_us() < deadline)) {
        pthread_mutex_unlock(&mu);
        sleep_ms(5);
        pthread_mutex_lock(&mu);
    }
    int rc = blocked(fn) ? ST_TIMEOUT : ST_OK;
    memcpy(path, engine_path, sizeof path);
    pthread_mutex_unlock(&mu);
    if (rc == ST_OK && path[0]) {
        int64_t left_ms = (deadline - now_us()) / 1000;
        rc = left_ms > 0 ? engine_round_trip(path, left_ms) : ST_TIMEOUT;
    }
    pthread_mutex_lock(&mu);
    st_waiting--;
    if (rc == ST_TIMEOUT) st_request_timeouts++;
    pthread_mutex_unlock(&mu);
    return rc;
}

static conn_t *conn_of(dcgmHandle_t h);

/* A request on a connection: refused at once on a closed one (the client knows), else it waits for
 * the engine's answer at most the client's request timeout. */
static int request(const char *fn, dcgmHandle_t h) {
    pthread_mutex_lock(&mu);
    int64_t timeout_ms = request_timeout_ms;
    int open = conn_of(h) != NULL;
    pthread_mutex_unlock(&mu);
    return open ? engine_answers(fn, timeout_ms) : ST_CONNECTION_NOT_VALID;
}
#define REQUEST(fn, h) do { int _rc = request(fn, h); if (_rc != ST_OK) return _rc; } while (0)

static void reset_engine_state(void) {
    memset(groups, 0, sizeof(groups));
    num_groups = DEFAULT_GROUPS;
    next_group = DEFAULT_GROUPS;
    memset(samples, 0, sizeof(samples));
    memset(xid_seen, 0, sizeof(xid_seen));
    diag_running = 0;
}

static int forced(const char *fn) {
    for (int i = 0; i < 8; i++)
        if (fail_code[i] != 0 && strcmp(fn, fail_fn[i]) == 0) return fail_code[i];
    return 0;
}

/* the connection behind a handle, or NULL (closed, or made before a restart) */
static conn_t *conn_of(dcgmHandle_t h) {
    if (h == 0 || h >= MAX_CONNS || !up) return NULL;
    conn_t *c = &conns[h];
    return c->open && c->generation == generation ? c : NULL;
}

static group_t *group_of(dcgmGpuGrp_t id) {
    for (int i = 0; i < MAX_GROUPS; i++)
        if (groups[i].used && groups[i].id == id) return &groups[i];
    return NULL;
}

static void drop_groups_of(unsigned conn) {
    for (int i = 0; i < MAX_GROUPS; i++)
        if (groups[i].used && groups[i].owner == conn) {
            groups[i].used = 0;
            num_groups--;
        }
}

static int field_slot(unsigned short field) {
    for (unsigned i = 0; i < NFIELDS; i++)
        if (FIELDS[i] == field) return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ the DCGM C API */
int dcgmInit(void) { return ST_OK; }
int dcgmShutdown(void) { return ST_OK; }

const char *dcgmErrorString(int code) {
    switch (code) {
    case ST_OK: return "Success";
    case ST_CONNECTION_NOT_VALID: return "The connection to the host engine is not valid any longer";
    case ST_MAX_LIMIT: return "Max limit reached for the object";
    case ST_DIAG_ALREADY_RUNNING: return "A diag instance is already running";
    default: return "Unknown error";
    }
}

static int address_matches(const char *address) {
    if (strncmp(address, "tcp://", 6) == 0 && strcmp(listen_kind, "tcp") == 0) {
        const char *colon = strrchr(address + 6, ':');
        const char *port = colon ? colon + 1 : "5555";
        return strcmp(port, listen_where) == 0;
    }
    if (strncmp(address, "unix://", 7) == 0 && strcmp(listen_kind, "unix") == 0)
        return strcmp(address + 7, listen_where) == 0;
    return 0;
}

int dcgmConnect_v3(const char *address, connect_v3_t *params, dcgmHandle_t *handle) {
    if (address == NULL || params == NULL || handle == NULL) return ST_BADPARAM;
    if (params->version != CONNECT_V3_VERSION) return ST_VER_MISMATCH;
    int timeout_ms = params->timeoutMs ? (int)params->timeoutMs : 5000;
    int64_t deadline = now_us() + (int64_t)timeout_ms * 1000;
    if (engine_answers("dcgmConnect_v3", timeout_ms) != ST_OK) return ST_CONNECTION_NOT_VALID;
    pthread_mutex_lock(&mu);
    st_connects++;
    st_connect_timeout = params->timeoutMs;
    st_connect_persist = params->persistAfterDisconnect;
    snprintf(st_connect_address, sizeof(st_connect_address), "%s", address);
    for (;;) {
        if (up && address_matches(address) && !forced("dcgmConnect_v3")) break;
        if (now_us() >= deadline) {
            pthread_mutex_unlock(&mu);
            return ST_CONNECTION_NOT_VALID;
        }
        pthread_mutex_unlock(&mu);
        sleep_ms(50); /* DcgmClientHandler retries every 50 ms */
        pthread_mutex_lock(&mu);
    }
    if (next_conn >= MAX_CONNS) {
        pthread_mutex_unlock(&mu);
        return ST_MAX_LIMIT;
    }
    unsigned id = next_conn++;
    conns[id].open = 1;
    conns[id].generation = generation;
    conns[id].persist = params->persistAfterDisconnect != 0;
    *handle = id;
    pthread_mutex_unlock(&mu);
    return ST_OK;
}

int dcgmDisconnect(dcgmHandle_t h) {
    pthread_mutex_lock(&mu);
    conn_t *c = conn_of(h);
    if (c != NULL) {
        c->open = 0;
        if (!c->persist) drop_groups_of((unsigned)h);
        if (diag_running && diag_conn == h && (diag_flags & FLAG_HEARTBEAT)) diag_running = 0;
    } else if (h > 0 && h < MAX_CONNS) {
        conns[h].open = 0;
    }
    pthread_mutex_unlock(&mu);
    return ST_OK; /* always, as DCGM's */
}

int dcgmGetEntityGroupEntities(dcgmHandle_t h, int entityGroup, unsigned *entities, int *numEntities, unsigned flags) {
    (void)flags;
    REQUEST("dcgmGetEntityGroupEntities", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmGetEntityGroupEntities") : ST_CONNECTION_NOT_VALID;
    if (rc == ST_OK) {
        const unsigned *ids = entityGroup == FE_GPU ? gpu_ids : switch_ids;
        int n = entityGroup == FE_GPU ? n_gpus : entityGroup == FE_SWITCH ? n_switches : 0;
        if (*numEntities < n) {
            rc = ST_INSUFFICIENT_SIZE;
        } else {
            memcpy(entities, ids, sizeof(unsigned) * (size_t)n);
        }
        *numEntities = n;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* A GPU's attributes; only its identifiers (PCI address, as fake_set_gpu_pci set it) are filled.
 * A GPU id the engine does not have: BADPARAM. */
int dcgmGetDeviceAttributes(dcgmHandle_t h, int gpuId, device_attributes_v3_t *attrs) {
    if (attrs == NULL) return ST_BADPARAM;
    if (attrs->version != DEVICE_ATTRIBUTES_V3_VERSION) return ST_VER_MISMATCH;
    REQUEST("dcgmGetDeviceAttributes", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmGetDeviceAttributes") : ST_CONNECTION_NOT_VALID;
    int known = 0;
    for (int i = 0; i < n_gpus; i++) known |= gpu_ids[i] == (unsigned)gpuId;
    if (rc == ST_OK && (!known || gpuId < 0 || gpuId >= MAX_GPUS)) rc = ST_BADPARAM;
    if (rc == ST_OK) {
        unsigned version = attrs->version;
        memset(attrs, 0, sizeof(*attrs));
        attrs->version = version;
        snprintf(attrs->identifiers.pciBusId, sizeof(attrs->identifiers.pciBusId), "%s", gpu_pci[gpuId]);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmGroupCreate(dcgmHandle_t h, int type, const char *name, dcgmGpuGrp_t *groupId) {
    (void)type;
    (void)name;
    REQUEST("dcgmGroupCreate", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmGroupCreate") : ST_CONNECTION_NOT_VALID;
    if (rc == ST_OK && num_groups >= MAX_GROUPS) rc = ST_MAX_LIMIT;
    if (rc == ST_OK) {
        for (int i = 0; i < MAX_GROUPS; i++)
            if (!groups[i].used) {
                memset(&groups[i], 0, sizeof(groups[i]));
                groups[i].used = 1;
                groups[i].id = next_group++;
                groups[i].owner = (unsigned)h;
                *groupId = groups[i].id;
                break;
            }
        num_groups++;
        st_groups_created++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmGroupDestroy(dcgmHandle_t h, dcgmGpuGrp_t id) {
    REQUEST("dcgmGroupDestroy", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmGroupDestroy") : ST_CONNECTION_NOT_VALID;
    group_t *g = rc == ST_OK ? group_of(id) : NULL;
    if (rc == ST_OK && g == NULL) rc = ST_NOT_CONFIGURED;
    if (g != NULL) {
        g->used = 0;
        num_groups--;
        st_groups_destroyed++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmGroupAddEntity(dcgmHandle_t h, dcgmGpuGrp_t id, int entityGroup, unsigned entityId) {
    REQUEST("dcgmGroupAddEntity", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmGroupAddEntity") : ST_CONNECTION_NOT_VALID;
    group_t *g = rc == ST_OK ? group_of(id) : NULL;
    if (rc == ST_OK && g == NULL) rc = ST_NOT_CONFIGURED;
    if (g != NULL && g->n < 1024) {
        g->members[g->n].entityGroupId = (uint32_t)entityGroup;
        g->members[g->n].entityId = entityId;
        g->n++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static int health_set(dcgmHandle_t h, dcgmGpuGrp_t id, unsigned systems, int64_t interval, double keep) {
    int rc = conn_of(h) ? forced("dcgmHealthSet") : ST_CONNECTION_NOT_VALID;
    group_t *g = rc == ST_OK ? group_of(id) : NULL;
    if (rc == ST_OK && g == NULL) rc = ST_NOT_CONFIGURED;
    if (g != NULL) {
        g->systems = systems;
        g->interval = interval;
        g->keep_age = keep;
        st_health_sets++;
        st_health_systems = systems;
        st_health_interval = interval;
        st_health_keep_age = keep;
    }
    return rc;
}

int dcgmHealthSet(dcgmHandle_t h, dcgmGpuGrp_t id, unsigned systems) {
    REQUEST("dcgmHealthSet", h);
    pthread_mutex_lock(&mu);
    int rc = health_set(h, id, systems, 30000000, 600.0);
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmHealthSet_v2(dcgmHandle_t h, health_set_v2_t *p) {
    if (p == NULL) return ST_BADPARAM;
    if (p->version != HEALTH_SET_V2_VERSION) return ST_VER_MISMATCH;
    REQUEST("dcgmHealthSet_v2", h);
    pthread_mutex_lock(&mu);
    int rc = health_set(h, p->groupId, p->systems, p->updateInterval, p->maxKeepAge);
    pthread_mutex_unlock(&mu);
    return rc;
}

static void add_incident(health_v5_t *r, pair_t who, unsigned system, unsigned health, unsigned code, const char *msg) {
    if (r->incidentCount >= 1024) return;
    incident_t *inc = &r->incidents[r->incidentCount++];
    inc->system = system;
    inc->health = health;
    inc->error.code = code;
    snprintf(inc->error.msg, sizeof(inc->error.msg), "%s", msg);
    inc->entityInfo = who;
    if (health > r->overallHealth) r->overallHealth = health;
}

static const sample_t *latest(const series_t *s) { return s->n ? &s->s[s->n - 1] : NULL; }

/* the first sample at or after `since` (ascending order), as GetSamples(startTime, 0, ASCENDING) */
static const sample_t *first_since(const series_t *s, int64_t since) {
    for (int i = 0; i < s->n; i++)
        if (s->s[i].ts >= since) return &s->s[i];
    return NULL;
}

/* |latest - first of the last minute|, or -1 without two readings */
static int64_t minute_change(const series_t *s, int64_t now) {
    const sample_t *a = first_since(s, now - 60000000), *b = latest(s);
    if (a == NULL || b == NULL) return -1;
    return a->v >= b->v ? a->v - b->v : b->v - a->v;
}

typedef struct { int xid; unsigned health; unsigned system; unsigned code; const char *what; } xid_rule_t;
static const xid_rule_t XIDS[] = {
    {48, RESULT_FAIL, HW_ALL, 101, "Double Bit ECC Error"},
    {74, RESULT_FAIL, HW_ALL, 101, "NVLink Critical Error"},
    {79, RESULT_FAIL, HW_ALL, 120, "GPU has fallen off the bus"},
    {94, RESULT_WARN, HW_ALL, 131, "Contained error"},
    {95, RESULT_FAIL, HW_ALL, 81, "Uncontained error"},
    {119, RESULT_FAIL, HW_ALL, 101, "GSP RPC Timeout"},
    {120, RESULT_FAIL, HW_ALL, 101, "GSP Error"},
    {140, RESULT_FAIL, HW_ALL, 101, "ECC unrecovered error"},
    {31, RESULT_WARN, HW_MEM, 101, "MMU Error"},
    {43, RESULT_WARN, HW_MEM, 101, "Reset Channel Verif Error"},
    {64, RESULT_FAIL, HW_MEM, 80, "Row remap failure"},
    {38, RESULT_WARN, HW_PCIE, 101, "PCIe Bus Error"},
    {62, RESULT_WARN, HW_THERMAL, 101, "Thermal Violation"},
    {73, RESULT_WARN, HW_NVLINK, 101, "NVLink Flow Control Error"},
};

static void judge_gpu(health_v5_t *r, const group_t *g, unsigned gpu, int64_t now) {
    pair_t who = {FE_GPU, gpu};
    char msg[256];
    if (gpu >= MAX_GPUS) return;
    for (unsigned i = 0; i < sizeof(XIDS) / sizeof(XIDS[0]); i++) {
        const xid_rule_t *x = &XIDS[i];
        if (!xid_seen[gpu][x->xid] || (x->system != HW_ALL && !(g->systems & x->system))) continue;
        snprintf(msg, sizeof(msg), "Detected XID %d for GPU %u (%s)", x->xid, gpu, x->what);
        add_incident(r, who, x->system, x->health, x->code, msg);
    }
    const series_t *s = samples[gpu];
    const sample_t *v;
    if (g->systems & HW_MEM) {
        if ((v = latest(&s[field_slot(311)])) != NULL && v->v > 0) {
            snprintf(msg, sizeof(msg), "Detected %lld volatile double-bit ECC error(s) in GPU %u.", (long long)v->v, gpu);
            add_incident(r, who, HW_MEM, RESULT_FAIL, 4, msg);
        }
        if ((v = latest(&s[field_slot(395)])) != NULL && v->v > 0)
            add_incident(r, who, HW_MEM, RESULT_FAIL, 80, "GPU had a row remap failure and should be serviced");
        if ((v = latest(&s[field_slot(393)])) != NULL && v->v >= 512) {
            snprintf(msg, sizeof(msg), "GPU %u had %lld uncorrectable row remaps", gpu, (long long)v->v);
            add_incident(r, who, HW_MEM, RESULT_WARN, 84, msg);
        }
    }
    int64_t d;
    if ((g->systems & HW_PCIE) && (d = minute_change(&s[field_slot(202)], now)) > 8) {
        snprintf(msg, sizeof(msg), "Detected more than 8 PCIe replays per minute for GPU %u : %lld", gpu, (long long)d);
        add_incident(r, who, HW_PCIE, RESULT_WARN, 3, msg);
    }
    if ((g->systems & HW_THERMAL) && (d = minute_change(&s[field_slot(241)], now)) > 0) {
        snprintf(msg, sizeof(msg), "Clocks are being optimized for GPU %u because of thermal violation", gpu);
        add_incident(r, who, HW_THERMAL, RESULT_WARN, 10, msg);
    }
    if ((g->systems & HW_NVLINK) && (d = minute_change(&s[field_slot(439)], now)) >= 1) {
        snprintf(msg, sizeof(msg), "Detected %lld nvlink_recovery_error NvLink errors on GPU %u", (long long)d, gpu);
        add_incident(r, who, HW_NVLINK, RESULT_FAIL, 71, msg);
    }
}

int dcgmHealthCheck(dcgmHandle_t h, dcgmGpuGrp_t id, health_v5_t *r) {
    if (r == NULL) return ST_BADPARAM;
    if (r->version != HEALTH_V5_VERSION) return ST_VER_MISMATCH;
    REQUEST("dcgmHealthCheck", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmHealthCheck") : ST_CONNECTION_NOT_VALID;
    const group_t *g = rc == ST_OK ? group_of(id) : NULL;
    if (rc == ST_OK && g == NULL) rc = ST_NOT_CONFIGURED;
    if (g != NULL) {
        st_health_checks++;
        r->overallHealth = 0;
        r->incidentCount = 0;
        int64_t now = now_us();
        for (int m = 0; m < g->n; m++) {
            pair_t who = g->members[m];
            if (who.entityGroupId == FE_GPU) judge_gpu(r, g, who.entityId, now);
            for (int i = 0; i < n_extra; i++)
                if (extra[i].group == who.entityGroupId && extra[i].id == who.entityId && (g->systems & extra[i].system))
                    add_incident(r, who, extra[i].system, extra[i].health, extra[i].code, extra[i].msg);
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmActionValidate_v2(dcgmHandle_t h, run_diag_v10_t *drd, diag_v12_t *resp) {
    if (drd == NULL || resp == NULL) return ST_BADPARAM;
    if (drd->version != RUN_DIAG_V10_VERSION || resp->version != DIAG_V12_VERSION) return ST_VER_MISMATCH;
    REQUEST("dcgmActionValidate_v2", h);
    int64_t started = now_us();
    pthread_mutex_lock(&mu);
    st_diag_calls++;
    st_diag_validate = drd->validate;
    st_diag_flags = drd->flags;
    st_diag_timeout = drd->timeoutSeconds;
    snprintf(st_diag_entities, sizeof(st_diag_entities), "%s", drd->entityIds);
    snprintf(st_diag_tests, sizeof(st_diag_tests), "%s", drd->testNames[0]);
    int rc = conn_of(h) ? forced("dcgmActionValidate_v2") : ST_CONNECTION_NOT_VALID;
    if (rc == ST_OK && diag_running) rc = ST_DIAG_ALREADY_RUNNING;
    if (rc != ST_OK) {
        pthread_mutex_unlock(&mu);
        return rc;
    }
    diag_running = 1;
    diag_conn = (unsigned)h;
    diag_flags = (int)drd->flags;
    last_beat_us = started;
    unsigned run = generation;
    while (diag_hold && diag_running && generation == run) {
        int64_t now = now_us();
        if ((diag_flags & FLAG_HEARTBEAT) && now - last_beat_us > heartbeat_timeout_ms * 1000) {
            diag_running = 0; /* the engine aborts a diag whose client stopped beating */
            pthread_mutex_unlock(&mu);
            return ST_DIAG_STOPPED;
        }
        if (drd->timeoutSeconds && now - started >= (int64_t)drd->timeoutSeconds * 1000000) {
            pthread_mutex_unlock(&mu); /* client-side timeout: the engine goes on running it */
            return ST_TIMEOUT;
        }
        pthread_mutex_unlock(&mu);
        sleep_ms(5);
        pthread_mutex_lock(&mu);
    }
    if (!diag_running || generation != run) {
        pthread_mutex_unlock(&mu);
        return generation != run ? ST_CONNECTION_NOT_VALID : ST_DIAG_STOPPED;
    }
    diag_running = 0;
    unsigned version = resp->version;
    if (diag_answer != NULL) memcpy(resp, diag_answer, sizeof(*resp));
    resp->version = version;
    rc = diag_error;
    if (rc != ST_OK && diag_error_msg[0] && resp->numErrors < 32) {
        diag_error_t *e = &resp->errors[resp->numErrors++];
        memset(e, 0, sizeof(*e));
        e->testId = 0x80; /* DCGM_DIAG_RESPONSE_SYSTEM_ERROR (DCGM_INT8_BLANK) */
        snprintf(e->msg, sizeof(e->msg), "%s", diag_error_msg);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmDiagSendHeartbeat(dcgmHandle_t h) {
    REQUEST("dcgmDiagSendHeartbeat", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmDiagSendHeartbeat") : ST_CONNECTION_NOT_VALID;
    if (rc == ST_OK) {
        st_heartbeats++;
        last_beat_us = now_us();
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int dcgmInjectEntityFieldValue(dcgmHandle_t h, int entityGroup, unsigned entityId, field_value_v1_t *v) {
    if (v == NULL) return ST_BADPARAM;
    if (v->version != FIELD_VALUE_V1_VERSION) return ST_VER_MISMATCH;
    REQUEST("dcgmInjectEntityFieldValue", h);
    pthread_mutex_lock(&mu);
    int rc = conn_of(h) ? forced("dcgmInjectEntityFieldValue") : ST_CONNECTION_NOT_VALID;
    int slot = field_slot(v->fieldId);
    if (rc == ST_OK && slot < 0) rc = ST_UNKNOWN_FIELD;
    if (rc == ST_OK && v->fieldType != 'i') rc = ST_BADPARAM; /* must equal the field's type (int64) */
    if (rc == ST_OK && (entityGroup != FE_GPU || entityId >= MAX_GPUS)) rc = ST_BADPARAM;
    if (rc == ST_OK) {
        if (n_injected < 256) {
            injected[n_injected] = *v;
            injected_gpu[n_injected++] = entityId;
        }
        st_injections++;
        series_t *s = &samples[entityId][slot];
        if (s->n == MAX_SAMPLES) {
            memmove(&s->s[0], &s->s[1], sizeof(sample_t) * (MAX_SAMPLES - 1));
            s->n--;
        }
        int i = s->n;
        while (i > 0 && s->s[i - 1].ts > v->ts) {
            s->s[i] = s->s[i - 1];
            i--;
        }
        s->s[i].ts = v->ts;
        s->s[i].v = v->value.i64;
        s->n++;
        if (v->fieldId == 230 && v->value.i64 > 0 && v->value.i64 < 256) xid_seen[entityId][v->value.i64] = 1;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ------------------------------------------------------------------ test control (fake_*) */
void fake_reset(void) {
    pthread_mutex_lock(&mu);
    generation++;
    up = 1;
    strcpy(listen_kind, "tcp");
    strcpy(listen_where, "5555");
    reset_engine_state();
    n_gpus = 2;
    gpu_ids[0] = 0;
    gpu_ids[1] = 1;
    memset(gpu_pci, 0, sizeof(gpu_pci));
    n_switches = 0;
    n_extra = 0;
    memset(fail_code, 0, sizeof(fail_code));
    free(diag_answer);
    diag_answer = NULL;
    diag_error = 0;
    diag_error_msg[0] = 0;
    diag_hold = 0;
    heartbeat_timeout_ms = 600000;
    engine_path[0] = 0;
    request_timeout_ms = 60000;
    memset(block_on, 0, sizeof(block_on));
    st_request_timeouts = 0;
    st_connects = st_groups_created = st_groups_destroyed = st_heartbeats = st_diag_calls = 0;
    st_health_sets = st_health_checks = st_injections = st_connect_timeout = st_connect_persist = 0;
    st_health_systems = st_health_interval = st_diag_validate = st_diag_flags = st_diag_timeout = 0;
    st_health_keep_age = 0;
    st_connect_address[0] = st_diag_entities[0] = st_diag_tests[0] = 0;
    n_injected = 0;
    pthread_mutex_unlock(&mu);
}

/* down: every connection breaks and connects are refused; up again: a restarted engine */
void fake_set_up(int value) {
    pthread_mutex_lock(&mu);
    if (!value && up) {
        generation++;
        reset_engine_state();
    }
    up = value;
    pthread_mutex_unlock(&mu);
}

void fake_restart(void) {
    pthread_mutex_lock(&mu);
    generation++;
    reset_engine_state();
    pthread_mutex_unlock(&mu);
}

void fake_listen(const char *kind, const char *where) {
    pthread_mutex_lock(&mu);
    snprintf(listen_kind, sizeof(listen_kind), "%s", kind);
    snprintf(listen_where, sizeof(listen_where), "%s", where);
    pthread_mutex_unlock(&mu);
}

void fake_set_entities(int entityGroup, const unsigned *ids, int n) {
    pthread_mutex_lock(&mu);
    if (n > 1024) n = 1024;
    if (entityGroup == FE_GPU) {
        memcpy(gpu_ids, ids, sizeof(unsigned) * (size_t)n);
        n_gpus = n;
    } else if (entityGroup == FE_SWITCH) {
        memcpy(switch_ids, ids, sizeof(unsigned) * (size_t)n);
        n_switches = n;
    }
    pthread_mutex_unlock(&mu);
}

/* the PCI address the engine names for a GPU id (dcgmGetDeviceAttributes) */
void fake_set_gpu_pci(unsigned id, const char *pci) {
    pthread_mutex_lock(&mu);
    if (id < MAX_GPUS) snprintf(gpu_pci[id], sizeof(gpu_pci[id]), "%s", pci);
    pthread_mutex_unlock(&mu);
}

/* an incident the engine reports while its system is watched (codes no injectable field reaches) */
void fake_add_incident(unsigned group, unsigned id, unsigned system, unsigned health, unsigned code, const char *msg) {
    pthread_mutex_lock(&mu);
    if (n_extra < MAX_EXTRA) {
        extra_t *e = &extra[n_extra++];
        e->group = group;
        e->id = id;
        e->system = system;
        e->health = health;
        e->code = code;
        snprintf(e->msg, sizeof(e->msg), "%s", msg);
    }
    pthread_mutex_unlock(&mu);
}

void fake_clear_incidents(void) {
    pthread_mutex_lock(&mu);
    n_extra = 0;
    pthread_mutex_unlock(&mu);
}

/* make an API function answer `code` on a live connection (0: answer normally again); up to 8 at once */
void fake_fail(const char *fn, int code) {
    pthread_mutex_lock(&mu);
    int slot = -1;
    for (int i = 0; i < 8; i++)
        if ((fail_code[i] != 0 && strcmp(fn, fail_fn[i]) == 0) || (slot < 0 && fail_code[i] == 0)) slot = i;
    if (slot >= 0) {
        snprintf(fail_fn[slot], sizeof(fail_fn[slot]), "%s", fn);
        fail_code[slot] = code;
    }
    pthread_mutex_unlock(&mu);
}

/* Answers come from the process listening on this Unix socket ("" = from this library again). */
void fake_engine_process(const char *path) {
    pthread_mutex_lock(&mu);
    snprintf(engine_path, sizeof(engine_path), "%s", path ? path : "");
    pthread_mutex_unlock(&mu);
}

/* How long a request waits for its answer before DCGM_ST_TIMEOUT (the client library's 60 s). */
void fake_set_request_timeout_ms(long long ms) {
    pthread_mutex_lock(&mu);
    request_timeout_ms = ms;
    pthread_mutex_unlock(&mu);
}

/* Make one API function wait for an answer that does not come (1: until the request's timeout; 2:
 * past every timeout, a call stuck in a wedged driver) or answer again (0); up to 8 at once. */
void fake_block(const char *fn, int on) {
    pthread_mutex_lock(&mu);
    int slot = -1;
    for (int i = 0; i < 8; i++)
        if ((block_on[i] && strcmp(fn, block_fn[i]) == 0) || (slot < 0 && !block_on[i])) slot = i;
    if (slot >= 0) {
        snprintf(block_fn[slot], sizeof(block_fn[slot]), "%s", fn);
        block_on[slot] = on;
    }
    pthread_mutex_unlock(&mu);
}

int fake_set_diag_response(const void *buf, size_t len) {
    if (len != sizeof(diag_v12_t)) return -1;
    pthread_mutex_lock(&mu);
    if (diag_answer == NULL) diag_answer = malloc(sizeof(diag_v12_t));
    memcpy(diag_answer, buf, len);
    pthread_mutex_unlock(&mu);
    return 0;
}

void fake_set_diag_error(int code, const char *msg) {
    pthread_mutex_lock(&mu);
    diag_error = code;
    snprintf(diag_error_msg, sizeof(diag_error_msg), "%s", msg ? msg : "");
    pthread_mutex_unlock(&mu);
}

void fake_diag_hold(int hold) {
    pthread_mutex_lock(&mu);
    diag_hold = hold;
    pthread_mutex_unlock(&mu);
}

void fake_set_heartbeat_timeout_ms(long long ms) {
    pthread_mutex_lock(&mu);
    heartbeat_timeout_ms = ms;
    pthread_mutex_unlock(&mu);
}

double fake_stat(const char *name) {
    double v = -1;
    pthread_mutex_lock(&mu);
    if (!strcmp(name, "connects")) v = (double)st_connects;
    else if (!strcmp(name, "groups")) v = num_groups - DEFAULT_GROUPS;
    else if (!strcmp(name, "groups_created")) v = (double)st_groups_created;
    else if (!strcmp(name, "groups_destroyed")) v = (double)st_groups_destroyed;
    else if (!strcmp(name, "heartbeats")) v = (double)st_heartbeats;
    else if (!strcmp(name, "diag_calls")) v = (double)st_diag_calls;
    else if (!strcmp(name, "diag_running")) v = diag_running;
    else if (!strcmp(name, "diag_validate")) v = (double)st_diag_validate;
    else if (!strcmp(name, "diag_flags")) v = (double)st_diag_flags;
    else if (!strcmp(name, "diag_timeout")) v = (double)st_diag_timeout;
    else if (!strcmp(name, "health_sets")) v = (double)st_health_sets;
    else if (!strcmp(name, "health_checks")) v = (double)st_health_checks;
    else if (!strcmp(name, "health_systems")) v = (double)st_health_systems;
    else if (!strcmp(name, "health_interval")) v = (double)st_health_interval;
    else if (!strcmp(name, "health_keep_age")) v = st_health_keep_age;
    else if (!strcmp(name, "injections")) v = (double)st_injections;
    else if (!strcmp(name, "connect_timeout")) v = (double)st_connect_timeout;
    else if (!strcmp(name, "connect_persist")) v = (double)st_connect_persist;
    else if (!strcmp(name, "last_connection")) v = next_conn - 1;
    else if (!strcmp(name, "waiting")) v = (double)st_waiting;
    else if (!strcmp(name, "request_timeouts")) v = (double)st_request_timeouts;
    else if (!strcmp(name, "open_connections")) {
        v = 0;
        for (unsigned i = 1; i < next_conn; i++) v += conns[i].open && conns[i].generation == generation;
    }
    pthread_mutex_unlock(&mu);
    return v;
}

const char *fake_text(const char *name) {
    if (!strcmp(name, "connect_address")) return st_connect_address;
    if (!strcmp(name, "diag_entities")) return st_diag_entities;
    if (!strcmp(name, "diag_tests")) return st_diag_tests;
    return "";
}

/* the i-th injected value: its GPU, field, value and timestamp (µs); -1 past the end */
int fake_injected(int i, unsigned *gpu, unsigned *field, long long *value, long long *ts, unsigned *version, int *type) {
    if (i < 0 || i >= n_injected) return -1;
    *gpu = injected_gpu[i];
    *field = injected[i].fieldId;
    *value = injected[i].value.i64;
    *ts = injected[i].ts;
    *version = injected[i].version;
    *type = injected[i].fieldType;
    return 0;
}

size_t fake_sizeof(const char *name) {
    if (!strcmp(name, "connect_v3")) return sizeof(connect_v3_t);
    if (!strcmp(name, "health_set_v2")) return sizeof(health_set_v2_t);
    if (!strcmp(name, "health_v5")) return sizeof(health_v5_t);
    if (!strcmp(name, "run_diag_v10")) return sizeof(run_diag_v10_t);
    if (!strcmp(name, "diag_v12")) return sizeof(diag_v12_t);
    if (!strcmp(name, "field_value_v1")) return sizeof(field_value_v1_t);
    if (!strcmp(name, "device_attributes_v3")) return sizeof(device_attributes_v3_t);
    return 0;
}
