/* A test double of NVIDIA's libnvidia-ml.so.1 (NVML): the calls slurm-tpu's energy readings make
 * (slurm_tpu/energy/nvml.py), with NVML's own return codes and error strings (the public nvml.h).
 *
 * Its GPUs are files: a state directory ($SLURM_TPU_NVML_DOUBLE_DIR, else "state" beside this
 * library) holds one file per GPU, named by its NVML PCI bus id ("00000000:41:00.0"), of
 * key=value lines:
 *
 *     energy_mj=<total energy since the driver loaded, mJ>   absent: NVML_ERROR_NOT_SUPPORTED (pre-Volta)
 *     power_mw=<power draw now, mW>                          absent: NVML_ERROR_NOT_SUPPORTED (Jetson)
 *     uuid=GPU-...                                           name=NVIDIA ...
 *     lost=1                                                 every query: NVML_ERROR_GPU_IS_LOST
 *
 * As the real library does, the first nvmlInit_v2 finds the GPUs (sorted by PCI address, NVML's
 * default order) and their handles stay valid until the last nvmlShutdown; a GPU added later is
 * seen after a new first init. A GPU's file is read again at every query, so a test changes its
 * counters by rewriting the file (atomically: tests/nvml_double/__init__.py set_gpu); a GPU whose
 * file is gone has fallen off the bus (NVML_ERROR_GPU_IS_LOST). No state directory at all: no
 * driver (nvmlInit_v2 gives NVML_ERROR_DRIVER_NOT_LOADED).
 *
 * A library that misbehaves, as a real one can (a GPU that fell off the bus, a driver mid-reload):
 * a file named "driver" in the state directory (not a bus id: never taken for a GPU), read at every
 * nvmlInit_v2, with key=value lines
 *
 *     init_delay_ms=<ms>    nvmlInit_v2 takes that long before it answers
 *     hang=1                nvmlInit_v2 never returns
 *     crash=1               nvmlInit_v2 kills its process (abort: SIGABRT)
 *
 * and, in a GPU's file, hang=1: every query of that GPU never returns.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define MAX_GPUS 64
#define MAX_FILE 4096

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

struct nvmlDevice_st {
    unsigned int domain, bus, device, function;
    char file[NAME_MAX + 1]; /* the state file's name, as the test wrote it */
};
typedef struct nvmlDevice_st *nvmlDevice_t;

/* One process's NVML: what the real library keeps between nvmlInit_v2 and the last nvmlShutdown. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int init_count;
static struct nvmlDevice_st gpus[MAX_GPUS];
static unsigned int gpu_count;
static char state_dir[PATH_MAX];

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    default: return "Unknown Error";
    }
}

/* Parse a PCI bus id in the forms NVML accepts (hexadecimal): domain:bus:device.function,
 * domain:bus:device, bus:device.function. 1 on success. */
static int parse_bus_id(const char *text, unsigned int *domain, unsigned int *bus, unsigned int *device,
                        unsigned int *function) {
    unsigned int a, b, c, d;
    int end = -1;
    *function = 0;
    *domain = 0;
    if (sscanf(text, "%x:%x:%x.%x%n", &a, &b, &c, &d, &end) == 4 && end == (int)strlen(text)) {
        *domain = a, *bus = b, *device = c, *function = d;
    } else if (end = -1, sscanf(text, "%x:%x:%x%n", &a, &b, &c, &end) == 3 && end == (int)strlen(text)) {
        *domain = a, *bus = b, *device = c;
    } else if (end = -1, sscanf(text, "%x:%x.%x%n", &a, &b, &c, &end) == 3 && end == (int)strlen(text)) {
        *bus = a, *device = b, *function = c;
    } else {
        return 0;
    }
    return *bus <= 0xff && *device <= 0x1f && *function <= 7;
}

static int compare_gpus(const void *left, const void *right) {
    const struct nvmlDevice_st *a = left, *b = right;
    if (a->domain != b->domain) return a->domain < b->domain ? -1 : 1;
    if (a->bus != b->bus) return a->bus < b->bus ? -1 : 1;
    if (a->device != b->device) return a->device < b->device ? -1 : 1;
    if (a->function != b->function) return a->function < b->function ? -1 : 1;
    return 0;
}

static void find_state_dir(void) {
    const char *named = getenv("SLURM_TPU_NVML_DOUBLE_DIR");
    Dl_info info;
    if (named != NULL && *named) {
        snprintf(state_dir, sizeof state_dir, "%s", named);
    } else if (dladdr((void *)nvmlErrorString, &info) && info.dli_fname != NULL) {
        snprintf(state_dir, sizeof state_dir, "%s", info.dli_fname);
        char *slash = strrchr(state_dir, '/');
        if (slash != NULL) {
            snprintf(slash + 1, sizeof state_dir - (size_t)(slash + 1 - state_dir), "state");
        } else {
            snprintf(state_dir, sizeof state_dir, "state");
        }
    } else {
        snprintf(state_dir, sizeof state_dir, "state");
    }
}

/* The first init: find the GPUs (lock held). */
static nvmlReturn_t discover(void) {
    find_state_dir();
    DIR *dir = opendir(state_dir);
    if (dir == NULL) return NVML_ERROR_DRIVER_NOT_LOADED;
    gpu_count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL && gpu_count < MAX_GPUS) {
        struct nvmlDevice_st *gpu = &gpus[gpu_count];
        if (entry->d_name[0] == '.' ||
            !parse_bus_id(entry->d_name, &gpu->domain, &gpu->bus, &gpu->device, &gpu->function))
            continue; /* a temporary file being written, or not a GPU */
        snprintf(gpu->file, sizeof gpu->file, "%s", entry->d_name);
        gpu_count++;
    }
    closedir(dir);
    qsort(gpus, gpu_count, sizeof gpus[0], compare_gpus);
    return NVML_SUCCESS;
}

/* Read the "driver" file's misbehaviour, if any, and act on it (before any lock is taken). */
static void misbehave_at_init(void) {
    char path[PATH_MAX + 8], text[MAX_FILE + 1];
    pthread_mutex_lock(&lock);
    find_state_dir();
    snprintf(path, sizeof path, "%s/driver", state_dir);
    pthread_mutex_unlock(&lock);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t length = read(fd, text, MAX_FILE);
    close(fd);
    if (length <= 0) return;
    text[length] = '\0';
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "init_delay_ms=", 14) == 0) {
            long ms = strtol(line + 14, NULL, 10);
            if (ms > 0) usleep((useconds_t)ms * 1000);
        } else if (strcmp(line, "hang=1") == 0) {
            for (;;) pause();
        } else if (strcmp(line, "crash=1") == 0) {
            abort();
        }
    }
}

nvmlReturn_t nvmlInit_v2(void) {
    nvmlReturn_t result = NVML_SUCCESS;
    misbehave_at_init();
    pthread_mutex_lock(&lock);
    if (init_count == 0) result = discover();
    if (result == NVML_SUCCESS) init_count++;
    pthread_mutex_unlock(&lock);
    return result;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t result = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        result = NVML_ERROR_UNINITIALIZED;
    else
        init_count--;
    pthread_mutex_unlock(&lock);
    return result;
}

/* A GPU's state file, read now. */
struct reading {
    int has_energy, has_power, lost;
    unsigned long long energy_mj;
    unsigned int power_mw;
    char uuid[96], name[96];
};

static nvmlReturn_t read_gpu(nvmlDevice_t device, struct reading *out) {
    char path[PATH_MAX + NAME_MAX + 2], text[MAX_FILE + 1];
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&lock);
    int valid = init_count > 0 && device >= gpus && device < gpus + gpu_count;
    int initialised = init_count > 0;
    if (valid) snprintf(path, sizeof path, "%s/%s", state_dir, device->file);
    pthread_mutex_unlock(&lock);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!valid) return NVML_ERROR_INVALID_ARGUMENT;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NVML_ERROR_GPU_IS_LOST; /* its file is gone: fallen off the bus */
    ssize_t length = read(fd, text, MAX_FILE);
    close(fd);
    if (length < 0) return NVML_ERROR_UNKNOWN;
    text[length] = '\0';
    snprintf(out->uuid, sizeof out->uuid, "GPU-00000000-0000-0000-0000-%012x",
             device->domain << 16 | device->bus << 8 | device->device << 3 | device->function);
    snprintf(out->name, sizeof out->name, "NVIDIA A100-SXM4-40GB");
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *value = strchr(line, '=');
        if (value == NULL) continue;
        *value++ = '\0';
        char *end = NULL;
        errno = 0;
        if (strcmp(line, "energy_mj") == 0) {
            out->energy_mj = strtoull(value, &end, 10);
            out->has_energy = errno == 0 && end != value && *end == '\0';
        } else if (strcmp(line, "power_mw") == 0) {
            unsigned long power = strtoul(value, &end, 10);
            out->has_power = errno == 0 && end != value && *end == '\0' && power <= 0xffffffffUL;
            out->power_mw = (unsigned int)power;
        } else if (strcmp(line, "uuid") == 0) {
            snprintf(out->uuid, sizeof out->uuid, "%s", value);
        } else if (strcmp(line, "name") == 0) {
            snprintf(out->name, sizeof out->name, "%s", value);
        } else if (strcmp(line, "lost") == 0) {
            out->lost = strcmp(value, "1") == 0;
        } else if (strcmp(line, "hang") == 0 && strcmp(value, "1") == 0) {
            for (;;) pause(); /* a GPU whose query never returns */
        }
    }
    return out->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t result = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        result = NVML_ERROR_UNINITIALIZED;
    else if (count == NULL)
        result = NVML_ERROR_INVALID_ARGUMENT;
    else
        *count = gpu_count;
    pthread_mutex_unlock(&lock);
    return result;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t result = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        result = NVML_ERROR_UNINITIALIZED;
    else if (device == NULL || index >= gpu_count)
        result = NVML_ERROR_INVALID_ARGUMENT;
    else
        *device = &gpus[index];
    pthread_mutex_unlock(&lock);
    return result;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    unsigned int domain, bus, dev, function;
    nvmlReturn_t result = NVML_ERROR_NOT_FOUND;
    pthread_mutex_lock(&lock);
    if (init_count == 0) {
        result = NVML_ERROR_UNINITIALIZED;
    } else if (pciBusId == NULL || device == NULL || !parse_bus_id(pciBusId, &domain, &bus, &dev, &function)) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        for (unsigned int i = 0; i < gpu_count; i++) {
            struct nvmlDevice_st *gpu = &gpus[i];
            if (gpu->domain == domain && gpu->bus == bus && gpu->device == dev && gpu->function == function) {
                *device = gpu;
                result = NVML_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    struct reading now;
    nvmlReturn_t result = read_gpu(device, &now);
    if (result != NVML_SUCCESS) return result;
    if (energy == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!now.has_energy) return NVML_ERROR_NOT_SUPPORTED;
    *energy = now.energy_mj;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    struct reading now;
    nvmlReturn_t result = read_gpu(device, &now);
    if (result != NVML_SUCCESS) return result;
    if (power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!now.has_power) return NVML_ERROR_NOT_SUPPORTED;
    *power = now.power_mw;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *text, char *buffer, unsigned int length) {
    if (buffer == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buffer, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct reading now;
    nvmlReturn_t result = read_gpu(device, &now);
    return result != NVML_SUCCESS ? result : copy_text(now.uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct reading now;
    nvmlReturn_t result = read_gpu(device, &now);
    return result != NVML_SUCCESS ? result : copy_text(now.name, name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct reading now;
    nvmlReturn_t result = read_gpu(device, &now);
    if (result != NVML_SUCCESS) return result;
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = 0x20b010de; /* device id << 16 | NVIDIA's vendor id */
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", device->domain, device->bus, device->device,
             device->function);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", device->domain & 0xffff,
             device->bus, device->device, device->function);
    return NVML_SUCCESS;
}
