/*
 * A test double for libedgetpu.so.1, used only by the tests.
 *
 * It exports what the runner uses of the real library: the C API
 * (edgetpu_list_devices / edgetpu_free_devices / edgetpu_create_delegate /
 * edgetpu_free_delegate / edgetpu_version; not edgetpu_verbosity, which the runner
 * treats as optional) and the TFLite external-delegate ABI
 * (tflite_plugin_create_delegate / tflite_plugin_destroy_delegate).
 *
 * Honest by construction:
 *  - the device list comes from EDGETPU_DOUBLE_DEVICES ("usb:/sys/...,pci:/dev/apex_0"),
 *    in that order, so tests can reorder it the way libedgetpu's enumeration shifts;
 *  - EDGETPU_VISIBLE_DEVICES is honoured as the node's libedgetpu (slurm-tpu's patch,
 *    scripts/libedgetpu-visible-devices.patch) honours it: when set, even empty, only the
 *    devices it lists are listed, in its order, and an explicit path it does not list is
 *    refused with the same one stderr line ("... is not in EDGETPU_VISIBLE_DEVICES=...");
 *    built with -DEDGETPU_DOUBLE_IGNORES_VISIBLE it stands in for Coral's own library;
 *  - the default device (no "device" option) is the first PCIe one, else the first USB
 *    one, as in the real library (EdgeTpuManagerDirect::OpenDeviceInternal);
 *  - edgetpu_create_delegate fails (NULL) for a path that is not in the list, like
 *    the real library for a device it cannot open;
 *  - every create/destroy appends one line to the file named by EDGETPU_DOUBLE_LOG:
 *    "<call> type=<usb|pci> path=<path> options=<k=v;...> pid=<pid>";
 *  - its delegate claims no nodes (Prepare does nothing), so the model runs on the CPU.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* TfLiteDelegate as laid out in tensorflow/lite/core/c/common.h (TF 2.13+ / LiteRT):
 * data_, Prepare, CopyFromBufferHandle, CopyToBufferHandle, FreeBufferHandle,
 * flags (int64_t), opaque_delegate_builder. Function pointers are only ever called
 * by the runtime, so their parameter types can be void* here. */
typedef struct TfLiteDelegate {
  void *data_;
  int (*Prepare)(void *context, struct TfLiteDelegate *delegate);
  int (*CopyFromBufferHandle)(void *context, struct TfLiteDelegate *delegate, int handle, void *tensor);
  int (*CopyToBufferHandle)(void *context, struct TfLiteDelegate *delegate, int handle, void *tensor);
  void (*FreeBufferHandle)(void *context, struct TfLiteDelegate *delegate, int *handle);
  int64_t flags;
  void *opaque_delegate_builder;
} TfLiteDelegate;

enum edgetpu_device_type { EDGETPU_APEX_PCI = 0, EDGETPU_APEX_USB = 1 };

struct edgetpu_device {
  enum edgetpu_device_type type;
  const char *path;
};

struct edgetpu_option {
  const char *name;
  const char *value;
};

/* What a created delegate remembers, for the log line at destroy time. */
typedef struct {
  TfLiteDelegate delegate;
  char type[8];
  char path[512];
} DoubleDelegate;

static int prepare_claims_nothing(void *context, TfLiteDelegate *delegate) {
  (void)context;
  (void)delegate;
  return 0; /* kTfLiteOk, and no ReplaceNodeSubsetsWithDelegateKernels call */
}

static void log_line(const char *call, const char *type, const char *path, const char *options) {
  const char *log = getenv("EDGETPU_DOUBLE_LOG");
  if (!log || !*log) return;
  char line[2048];
  int n = snprintf(line, sizeof line, "%s type=%s path=%s options=%s pid=%d\n", call, type,
                   path, options, (int)getpid());
  if (n <= 0) return;
  if (n >= (int)sizeof line) n = sizeof line - 1;
  /* O_APPEND + one write(): lines from several processes never interleave. */
  int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  ssize_t ignored = write(fd, line, (size_t)n);
  (void)ignored;
  close(fd);
}

/* Whether EDGETPU_VISIBLE_DEVICES (set) lists `path`; 1 when it is unset. */
static int visible(const char *path) {
#ifdef EDGETPU_DOUBLE_IGNORES_VISIBLE
  (void)path;
  return 1;
#else
  const char *list = getenv("EDGETPU_VISIBLE_DEVICES");
  if (!list) return 1;
  size_t len = strlen(path);
  for (const char *entry = list; *entry;) {
    const char *end = strchr(entry, ',');
    size_t n = end ? (size_t)(end - entry) : strlen(entry);
    if (n == len && strncmp(entry, path, n) == 0) return 1;
    entry += n + (end ? 1 : 0);
  }
  return 0;
#endif
}

/* Keeps the visible devices, in EDGETPU_VISIBLE_DEVICES's order (a no-op when it is unset). */
static size_t only_visible(struct edgetpu_device *devices, size_t n) {
#ifndef EDGETPU_DOUBLE_IGNORES_VISIBLE
  const char *list = getenv("EDGETPU_VISIBLE_DEVICES");
  if (!list) return n;
  struct edgetpu_device kept[64];
  size_t k = 0;
  for (const char *entry = list; *entry && k < 64;) {
    const char *end = strchr(entry, ',');
    size_t len = end ? (size_t)(end - entry) : strlen(entry);
    for (size_t i = 0; i < n; i++) {
      if (strlen(devices[i].path) != len || strncmp(devices[i].path, entry, len) != 0) continue;
      int seen = 0;
      for (size_t j = 0; j < k; j++) seen |= kept[j].path == devices[i].path;
      if (!seen) kept[k++] = devices[i];
      break;
    }
    entry += len + (end ? 1 : 0);
  }
  memcpy(devices, kept, k * sizeof *devices);
  return k;
#else
  (void)devices;
  return n;
#endif
}

/* Parses EDGETPU_DOUBLE_DEVICES; returns a malloc'd array (paths point into one block). */
struct edgetpu_device *edgetpu_list_devices(size_t *num_devices) {
  *num_devices = 0;
  const char *spec = getenv("EDGETPU_DOUBLE_DEVICES");
  if (!spec || !*spec) return NULL;
  size_t count = 1;
  for (const char *c = spec; *c; c++) count += (*c == ',');
  size_t len = strlen(spec) + 1;
  /* One allocation: the array, then a copy of the spec the paths point into. */
  struct edgetpu_device *devices = calloc(1, count * sizeof *devices + len);
  if (!devices) return NULL;
  char *text = (char *)(devices + count);
  memcpy(text, spec, len);
  size_t n = 0;
  for (char *entry = strtok(text, ","); entry; entry = strtok(NULL, ",")) {
    char *colon = strchr(entry, ':');
    if (!colon) continue;
    *colon = '\0';
    devices[n].type = strcmp(entry, "pci") == 0 ? EDGETPU_APEX_PCI : EDGETPU_APEX_USB;
    devices[n].path = colon + 1;
    n++;
  }
  *num_devices = only_visible(devices, n);
  return devices;
}

void edgetpu_free_devices(struct edgetpu_device *dev) { free(dev); }

/* Says plainly what it is: `infer --benchmark` and `metrics` print this string. */
const char *edgetpu_version(void) { return "slurm-tpu test double of libedgetpu (no Edge TPU)"; }

static TfLiteDelegate *make_delegate(const char *type, const char *path, const char *options) {
  DoubleDelegate *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->delegate.data_ = d;
  d->delegate.Prepare = prepare_claims_nothing;
  d->delegate.flags = 0;
  snprintf(d->type, sizeof d->type, "%s", type);
  snprintf(d->path, sizeof d->path, "%s", path);
  log_line("create", type, path, options);
  return &d->delegate;
}

static void free_delegate(TfLiteDelegate *delegate, const char *call) {
  if (!delegate) return;
  DoubleDelegate *d = (DoubleDelegate *)delegate->data_;
  log_line(call, d->type, d->path, "-");
  free(d);
}

static void join_options(char *out, size_t size, const char *const *keys,
                         const char *const *values, size_t n) {
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    size_t used = strlen(out);
    snprintf(out + used, size - used, "%s%s=%s", i ? ";" : "", keys[i], values[i]);
  }
  if (!out[0]) snprintf(out, size, "-");
}

TfLiteDelegate *edgetpu_create_delegate(enum edgetpu_device_type type, const char *name,
                                        const struct edgetpu_option *options, size_t num_options) {
  const char *type_name = type == EDGETPU_APEX_PCI ? "pci" : "usb";
  if (name && !visible(name)) {
    fprintf(stderr, "E edgetpu_double.c] Edge TPU %s is not in EDGETPU_VISIBLE_DEVICES=\"%s\": not opening it\n",
            name, getenv("EDGETPU_VISIBLE_DEVICES"));
    log_line("create-refused", type_name, name, "-");
    return NULL;
  }
  size_t n = 0;
  struct edgetpu_device *devices = edgetpu_list_devices(&n);
  int found = 0;
  for (size_t i = 0; i < n; i++)
    if (devices[i].type == type && name && strcmp(devices[i].path, name) == 0) found = 1;
  edgetpu_free_devices(devices);
  if (!found) {
    log_line("create-failed", type_name, name ? name : "(null)", "-");
    return NULL;
  }
  const char *keys[16], *values[16];
  size_t k = num_options < 16 ? num_options : 16;
  for (size_t i = 0; i < k; i++) {
    keys[i] = options[i].name;
    values[i] = options[i].value;
  }
  char joined[1024];
  join_options(joined, sizeof joined, keys, values, k);
  return make_delegate(type_name, name, joined);
}

void edgetpu_free_delegate(TfLiteDelegate *delegate) { free_delegate(delegate, "free"); }

/* External-delegate ABI: option "device" is "", "usb", "usb:N", "pci", "pci:N" or ":N"
 * (an index into the list above), as in the real library. */
TfLiteDelegate *tflite_plugin_create_delegate(char **keys, char **values, size_t n,
                                              void (*report_error)(const char *)) {
  const char *device = "";
  for (size_t i = 0; i < n; i++)
    if (strcmp(keys[i], "device") == 0) device = values[i];
  size_t count = 0;
  struct edgetpu_device *devices = edgetpu_list_devices(&count);
  const char *colon = strchr(device, ':');
  char wanted[8] = "";
  size_t wlen = colon ? (size_t)(colon - device) : strlen(device);
  if (wlen < sizeof wanted) memcpy(wanted, device, wlen), wanted[wlen] = '\0';
  long index = colon ? strtol(colon + 1, NULL, 10) : 0;
  long seen = 0;
  TfLiteDelegate *result = NULL;
  /* No type and no index: the first PCIe device, else the first USB one. */
  if (!colon && !wanted[0]) {
    for (size_t i = 0; i < count; i++)
      if (devices[i].type == EDGETPU_APEX_PCI) {
        strcpy(wanted, "pci");
        break;
      }
  }
  for (size_t i = 0; i < count && !result; i++) {
    const char *type = devices[i].type == EDGETPU_APEX_PCI ? "pci" : "usb";
    if (wanted[0] && strcmp(wanted, type) != 0) continue;
    if (seen++ != index) continue;
    char joined[1024];
    join_options(joined, sizeof joined, (const char *const *)keys, (const char *const *)values, n);
    result = make_delegate(type, devices[i].path, joined);
  }
  edgetpu_free_devices(devices);
  if (!result && report_error) report_error("edgetpu double: no such device");
  return result;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate *delegate) { free_delegate(delegate, "destroy"); }
