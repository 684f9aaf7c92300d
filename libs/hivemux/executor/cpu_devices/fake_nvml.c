/*
 * A fake libnvidia-ml.so.1 (the CPU devices mode of `hivemux up --executor process`, and the NVML
 * backend tests): it exports the NVML entry points pynvml
 * (nvidia-ml-py) calls for hivemux's readings and serves values from a script file.
 *
 * The script path is read from $FAKE_NVML_SCRIPT on every call and the file is re-read each time,
 * so a test changes the values between two reads by rewriting the file. One directive a line,
 * '#' starts a comment:
 *
 *   init <code>                 nvmlInit/nvmlInitWithFlags returns this nvmlReturn_t (default 0)
 *   driver <version>
 *   count <n>                   number of devices (at most FAKE_MAX_DEVICES)
 *   dev <i> <key> <value...>    a per-device value; a value "!<code>" makes the call return that
 *                               nvmlReturn_t instead (e.g. "!3" = NVML_ERROR_NOT_SUPPORTED)
 *        keys: name, uuid, util_gpu, util_mem, mem_total, mem_used, clock_sm, max_clock_sm,
 *              power_mw, temp, ecc_sbe, ecc_dbe, events (supported event-type mask, default 0x8),
 *              procs (only "!<code>"), procutil (only "!<code>")
 *   proc <i> <pid> <used_bytes|NA>                  a running compute process on device i
 *   procdir <i> <dir>           every live process with a file <dir>/<pid> (a decimal byte count,
 *                               what the fake libcuda writes with FAKE_CUDA_USAGE_DIR) is a
 *                               running compute process on device i holding that many bytes:
 *                               the "driver's" figure, whatever the process's own shim says
 *   procutil <i> <pid> <timestamp_us> <sm> <mem>    a process utilization sample on device i
 *   xid <i> <code>              an XID event; each event set delivers the xid lines in file order,
 *                               once each, to nvmlEventSetWait_v2 if device i registered for
 *                               nvmlEventTypeXidCriticalError
 *
 * Only the layouts pynvml uses are reproduced (c_nvmlMemory_t, c_nvmlProcessInfo_v2_t,
 * c_nvmlProcessUtilizationSample_t, c_nvmlEventData_t).
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define FAKE_MAX_DEVICES 8
#define FAKE_MAX_PROCS 32
#define FAKE_MAX_EVENTS 64
#define FAKE_TEXT 96

typedef struct nvmlDevice_st {
    unsigned int index;
} *nvmlDevice_t;

typedef struct nvmlEventSet_st {
    unsigned long long registered[FAKE_MAX_DEVICES];
    int cursor; /* index of the next xid line to consider */
} *nvmlEventSet_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* A scalar value or the error a call returns instead. */
typedef struct {
    unsigned long long value;
    nvmlReturn_t err;
} field_t;

typedef struct {
    char name[FAKE_TEXT];
    char uuid[FAKE_TEXT];
    field_t util_gpu, util_mem, mem_total, mem_used, clock_sm, max_clock_sm, power_mw, temp;
    field_t ecc_sbe, ecc_dbe, events, procs, procutil;
} device_t;

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned long long timestamp;
    unsigned int sm, mem;
    unsigned int dev;
} proc_t;

typedef struct {
    unsigned int dev;
    unsigned long long code;
} xid_t;

typedef struct {
    nvmlReturn_t init;
    char driver[FAKE_TEXT];
    unsigned int count;
    device_t devices[FAKE_MAX_DEVICES];
    proc_t procs[FAKE_MAX_PROCS];
    int nprocs;
    proc_t samples[FAKE_MAX_PROCS];
    int nsamples;
    xid_t xids[FAKE_MAX_EVENTS];
    int nxids;
} script_t;

static struct nvmlDevice_st g_handles[FAKE_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount = 0;

static void set_field(field_t *f, const char *text) {
    if (text[0] == '!') {
        f->err = (nvmlReturn_t)strtol(text + 1, NULL, 0);
    } else {
        f->err = NVML_SUCCESS;
        f->value = strtoull(text, NULL, 0);
    }
}

static void copy_text(char *dst, const char *src) {
    snprintf(dst, FAKE_TEXT, "%s", src);
}

static void script_defaults(script_t *s) {
    memset(s, 0, sizeof(*s));
    copy_text(s->driver, "535.129.03");
    for (unsigned int i = 0; i < FAKE_MAX_DEVICES; i++) {
        snprintf(s->devices[i].name, FAKE_TEXT, "Tesla T4");
        snprintf(s->devices[i].uuid, FAKE_TEXT, "GPU-00000000-0000-0000-0000-00000000000%u", i);
        s->devices[i].events.value = 0x8; /* nvmlEventTypeXidCriticalError */
    }
}

static void parse_dev_line(script_t *s, char *rest) {
    char *end = NULL;
    unsigned long idx = strtoul(rest, &end, 10);
    if (end == rest || idx >= FAKE_MAX_DEVICES)
        return;
    while (*end == ' ')
        end++;
    char *key = end;
    char *value = strchr(key, ' ');
    if (value == NULL)
        return;
    *value++ = '\0';
    while (*value == ' ')
        value++;
    device_t *d = &s->devices[idx];
    if (strcmp(key, "name") == 0)
        copy_text(d->name, value);
    else if (strcmp(key, "uuid") == 0)
        copy_text(d->uuid, value);
    else if (strcmp(key, "util_gpu") == 0)
        set_field(&d->util_gpu, value);
    else if (strcmp(key, "util_mem") == 0)
        set_field(&d->util_mem, value);
    else if (strcmp(key, "mem_total") == 0)
        set_field(&d->mem_total, value);
    else if (strcmp(key, "mem_used") == 0)
        set_field(&d->mem_used, value);
    else if (strcmp(key, "clock_sm") == 0)
        set_field(&d->clock_sm, value);
    else if (strcmp(key, "max_clock_sm") == 0)
        set_field(&d->max_clock_sm, value);
    else if (strcmp(key, "power_mw") == 0)
        set_field(&d->power_mw, value);
    else if (strcmp(key, "temp") == 0)
        set_field(&d->temp, value);
    else if (strcmp(key, "ecc_sbe") == 0)
        set_field(&d->ecc_sbe, value);
    else if (strcmp(key, "ecc_dbe") == 0)
        set_field(&d->ecc_dbe, value);
    else if (strcmp(key, "events") == 0)
        set_field(&d->events, value);
    else if (strcmp(key, "procs") == 0)
        set_field(&d->procs, value);
    else if (strcmp(key, "procutil") == 0)
        set_field(&d->procutil, value);
}

/* procdir: one running process per <dir>/<pid> file of a live pid. */
static void add_procdir(script_t *s, unsigned int dev, const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && s->nprocs < FAKE_MAX_PROCS) {
        char *end = NULL;
        unsigned long pid = strtoul(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || pid == 0)
            continue;
        if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
            continue; /* exited: NVML lists running processes only */
        char path[700], text[64] = "";
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        int ok = fgets(text, sizeof(text), f) != NULL;
        fclose(f);
        if (!ok)
            continue;
        proc_t *p = &s->procs[s->nprocs++];
        memset(p, 0, sizeof(*p));
        p->dev = dev;
        p->pid = (unsigned int)pid;
        p->used = strtoull(text, NULL, 10);
    }
    closedir(d);
}

/* Reads $FAKE_NVML_SCRIPT into *s; a missing variable or file gives the defaults (no devices). */
static void load_script(script_t *s) {
    script_defaults(s);
    const char *path = getenv("FAKE_NVML_SCRIPT");
    if (path == NULL)
        return;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "#\r\n")] = '\0';
        char *rest = strchr(line, ' ');
        if (rest == NULL)
            continue;
        *rest++ = '\0';
        while (*rest == ' ')
            rest++;
        if (strcmp(line, "init") == 0) {
            s->init = (nvmlReturn_t)strtol(rest, NULL, 0);
        } else if (strcmp(line, "driver") == 0) {
            copy_text(s->driver, rest);
        } else if (strcmp(line, "count") == 0) {
            unsigned long n = strtoul(rest, NULL, 10);
            s->count = n > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES : (unsigned int)n;
        } else if (strcmp(line, "dev") == 0) {
            parse_dev_line(s, rest);
        } else if (strcmp(line, "proc") == 0 && s->nprocs < FAKE_MAX_PROCS) {
            proc_t *p = &s->procs[s->nprocs];
            char used[32] = "";
            if (sscanf(rest, "%u %u %31s", &p->dev, &p->pid, used) == 3) {
                p->used = strcmp(used, "NA") == 0 ? ~0ULL : strtoull(used, NULL, 0);
                s->nprocs++;
            }
        } else if (strcmp(line, "procdir") == 0) {
            unsigned int dev = 0;
            char dir[400] = "";
            if (sscanf(rest, "%u %399s", &dev, dir) == 2)
                add_procdir(s, dev, dir);
        } else if (strcmp(line, "procutil") == 0 && s->nsamples < FAKE_MAX_PROCS) {
            proc_t *p = &s->samples[s->nsamples];
            if (sscanf(rest, "%u %u %llu %u %u", &p->dev, &p->pid, &p->timestamp, &p->sm, &p->mem) == 5)
                s->nsamples++;
        } else if (strcmp(line, "xid") == 0 && s->nxids < FAKE_MAX_EVENTS) {
            xid_t *x = &s->xids[s->nxids];
            if (sscanf(rest, "%u %llu", &x->dev, &x->code) == 2)
                s->nxids++;
        }
    }
    fclose(f);
}

/* Loads the script and resolves a handle to its device; NULL if NVML is not initialised or the
 * handle is not one of ours. */
static device_t *device_of(script_t *s, nvmlDevice_t handle, nvmlReturn_t *err) {
    if (g_refcount == 0) {
        *err = NVML_ERROR_UNINITIALIZED;
        return NULL;
    }
    load_script(s);
    if (handle == NULL || handle < &g_handles[0] || handle >= &g_handles[FAKE_MAX_DEVICES] ||
        handle->index >= s->count) {
        *err = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *err = NVML_SUCCESS;
    return &s->devices[handle->index];
}

#define WITH_DEVICE(handle, ...)                           \
    do {                                                    \
        static script_t s;                                  \
        nvmlReturn_t err_;                                  \
        pthread_mutex_lock(&g_lock);                        \
        device_t *d = device_of(&s, (handle), &err_);       \
        if (d == NULL) {                                    \
            pthread_mutex_unlock(&g_lock);                  \
            return err_;                                    \
        }                                                   \
        __VA_ARGS__;                                        \
        pthread_mutex_unlock(&g_lock);                      \
    } while (0)

#define RETURN_UNLOCKED(code)           \
    do {                                \
        pthread_mutex_unlock(&g_lock);  \
        return (code);                  \
    } while (0)

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    static script_t s;
    pthread_mutex_lock(&g_lock);
    load_script(&s);
    if (s.init != NVML_SUCCESS)
        RETURN_UNLOCKED(s.init);
    for (unsigned int i = 0; i < FAKE_MAX_DEVICES; i++)
        g_handles[i].index = i;
    g_refcount++;
    RETURN_UNLOCKED(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        RETURN_UNLOCKED(NVML_ERROR_UNINITIALIZED);
    g_refcount--;
    RETURN_UNLOCKED(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    default:
        return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    static script_t s;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        RETURN_UNLOCKED(NVML_ERROR_UNINITIALIZED);
    load_script(&s);
    if (version == NULL || strlen(s.driver) + 1 > length)
        RETURN_UNLOCKED(NVML_ERROR_INSUFFICIENT_SIZE);
    memcpy(version, s.driver, strlen(s.driver) + 1);
    RETURN_UNLOCKED(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    static script_t s;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        RETURN_UNLOCKED(NVML_ERROR_UNINITIALIZED);
    if (count == NULL)
        RETURN_UNLOCKED(NVML_ERROR_INVALID_ARGUMENT);
    load_script(&s);
    *count = s.count;
    RETURN_UNLOCKED(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    static script_t s;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        RETURN_UNLOCKED(NVML_ERROR_UNINITIALIZED);
    load_script(&s);
    if (device == NULL || index >= s.count)
        RETURN_UNLOCKED(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_handles[index];
    RETURN_UNLOCKED(NVML_SUCCESS);
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (dst == NULL || strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret;
    WITH_DEVICE(device, ret = copy_string(name, length, d->name));
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t ret;
    WITH_DEVICE(device, ret = copy_string(uuid, length, d->uuid));
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        if (d->util_gpu.err != NVML_SUCCESS)
            ret = d->util_gpu.err;
        else if (util == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else {
            util->gpu = (unsigned int)d->util_gpu.value;
            util->memory = (unsigned int)d->util_mem.value;
        }
    });
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        if (d->mem_total.err != NVML_SUCCESS)
            ret = d->mem_total.err;
        else if (memory == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else {
            memory->total = d->mem_total.value;
            memory->used = d->mem_used.value;
            memory->free = d->mem_total.value - d->mem_used.value;
        }
    });
    return ret;
}

static nvmlReturn_t uint_field(const field_t *f, unsigned int *out) {
    if (f->err != NVML_SUCCESS)
        return f->err;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)f->value;
    return NVML_SUCCESS;
}

#define NVML_CLOCK_SM 1
#define NVML_TEMPERATURE_GPU 0

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t ret;
    WITH_DEVICE(device, ret = type == NVML_CLOCK_SM ? uint_field(&d->clock_sm, clock) : NVML_ERROR_NOT_SUPPORTED);
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t ret;
    WITH_DEVICE(device,
                ret = type == NVML_CLOCK_SM ? uint_field(&d->max_clock_sm, clock) : NVML_ERROR_NOT_SUPPORTED);
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    nvmlReturn_t ret;
    WITH_DEVICE(device, ret = uint_field(&d->power_mw, power));
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    nvmlReturn_t ret;
    WITH_DEVICE(device, ret = sensor == NVML_TEMPERATURE_GPU ? uint_field(&d->temp, temp) : NVML_ERROR_NOT_SUPPORTED);
    return ret;
}

/* errorType: 0 corrected (single-bit), 1 uncorrected (double-bit); counterType is not modelled. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                                unsigned long long *count) {
    (void)counterType;
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        const field_t *f = errorType == 0 ? &d->ecc_sbe : &d->ecc_dbe;
        if (f->err != NVML_SUCCESS)
            ret = f->err;
        else if (count == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *count = f->value;
    });
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        if (d->procs.err != NVML_SUCCESS) {
            ret = d->procs.err;
        } else if (infoCount == NULL) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            unsigned int n = 0;
            for (int i = 0; i < s.nprocs; i++)
                n += s.procs[i].dev == device->index;
            if (n > *infoCount || (n > 0 && infos == NULL)) {
                *infoCount = n;
                ret = NVML_ERROR_INSUFFICIENT_SIZE;
            } else {
                unsigned int k = 0;
                for (int i = 0; i < s.nprocs; i++) {
                    if (s.procs[i].dev != device->index)
                        continue;
                    infos[k].pid = s.procs[i].pid;
                    infos[k].usedGpuMemory = s.procs[i].used;
                    infos[k].gpuInstanceId = ~0U;
                    infos[k].computeInstanceId = ~0U;
                    k++;
                }
                *infoCount = n;
            }
        }
    });
    return ret;
}

/* Samples newer than lastSeenTimeStamp; NVML_ERROR_NOT_FOUND when there are none, as NVML does. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        if (d->procutil.err != NVML_SUCCESS) {
            ret = d->procutil.err;
        } else if (processSamplesCount == NULL) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            unsigned int n = 0;
            for (int i = 0; i < s.nsamples; i++)
                n += s.samples[i].dev == device->index && s.samples[i].timestamp > lastSeenTimeStamp;
            if (n == 0) {
                *processSamplesCount = 0;
                ret = NVML_ERROR_NOT_FOUND;
            } else if (utilization == NULL || n > *processSamplesCount) {
                *processSamplesCount = n;
                ret = NVML_ERROR_INSUFFICIENT_SIZE;
            } else {
                unsigned int k = 0;
                for (int i = 0; i < s.nsamples; i++) {
                    const proc_t *p = &s.samples[i];
                    if (p->dev != device->index || p->timestamp <= lastSeenTimeStamp)
                        continue;
                    utilization[k].pid = p->pid;
                    utilization[k].timeStamp = p->timestamp;
                    utilization[k].smUtil = p->sm;
                    utilization[k].memUtil = p->mem;
                    utilization[k].encUtil = 0;
                    utilization[k].decUtil = 0;
                    k++;
                }
                *processSamplesCount = n;
            }
        }
    });
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        if (d->events.err != NVML_SUCCESS)
            ret = d->events.err;
        else if (eventTypes == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *eventTypes = d->events.value;
    });
    return ret;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        RETURN_UNLOCKED(NVML_ERROR_UNINITIALIZED);
    if (set == NULL)
        RETURN_UNLOCKED(NVML_ERROR_INVALID_ARGUMENT);
    *set = calloc(1, sizeof(**set));
    RETURN_UNLOCKED(*set == NULL ? NVML_ERROR_UNKNOWN : NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    nvmlReturn_t ret = NVML_SUCCESS;
    WITH_DEVICE(device, {
        if (set == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else if (d->events.err != NVML_SUCCESS)
            ret = d->events.err;
        else if ((eventTypes & ~d->events.value) != 0)
            ret = NVML_ERROR_NOT_SUPPORTED;
        else
            set->registered[device->index] |= eventTypes;
    });
    return ret;
}

static unsigned long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL;
}

#define XID_EVENT 0x8ULL

/* Delivers the next registered xid line, polling the script every 2 ms until timeoutms passes. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    static script_t s;
    unsigned long long deadline = now_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0)
            RETURN_UNLOCKED(NVML_ERROR_UNINITIALIZED);
        if (set == NULL || data == NULL)
            RETURN_UNLOCKED(NVML_ERROR_INVALID_ARGUMENT);
        load_script(&s);
        while (set->cursor < s.nxids) {
            const xid_t *x = &s.xids[set->cursor++];
            if (x->dev < s.count && (set->registered[x->dev] & XID_EVENT)) {
                data->device = &g_handles[x->dev];
                data->eventType = XID_EVENT;
                data->eventData = x->code;
                data->gpuInstanceId = ~0U;
                data->computeInstanceId = ~0U;
                RETURN_UNLOCKED(NVML_SUCCESS);
            }
        }
        pthread_mutex_unlock(&g_lock);
        if (now_ms() >= deadline)
            return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, 2 * 1000 * 1000};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
        }
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}
