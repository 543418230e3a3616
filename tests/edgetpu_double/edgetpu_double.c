/*
 * A test double for libedgetpu.so.1, used only by the tests.
 *
 * It exports what the runner uses of the real library: the C API
 * (edgetpu_list_devices / edgetpu_free_devices / edgetpu_create_delegate /
 * edgetpu_free_delegate / edgetpu_version / edgetpu_verbosity, which the runner raises
 * around a create to capture the library's stderr line when the open fails) and the TFLite
 * external-delegate ABI (tflite_plugin_create_delegate / tflite_plugin_destroy_delegate).
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
 *  - creating a delegate opens the device's node, as the real library does, and keeps it
 *    open until the delegate is freed: a PCIe card's node is the path listed (/dev/apex_N;
 *    the real driver open()s it O_RDWR), a USB stick's is the usbfs node
 *    /dev/bus/usb/BBB/DDD named by the busnum and devnum files of its sysfs directory
 *    (the real library reaches it through libusb_open). So the kernel's permissions decide,
 *    as on a node: a node that belongs to another job's user, or to root 0600 when idle,
 *    fails with EACCES. A failed open makes the create fail (NULL, no other device tried,
 *    as in EdgeTpuManagerDirect::OpenDeviceInternal) with one stderr line modelled on the
 *    real library's (tflite/edgetpu_context_direct.cc, EdgeTpuDriverWrapper, whose reason
 *    comes from driver/kernel/kernel_registers.cc for PCIe and from libusb_open through
 *    ConvertLibUsbError in driver/usb/local_usb_device.cc for USB):
 *      "E edgetpu_double.c] Failed to open device [Apex (PCIe)] at [<path>]: Failed
 *       precondition: Device open failed : -1 (Permission denied)"
 *      "E edgetpu_double.c] Failed to open device [Apex (USB)] at [<path>]: Permission
 *       denied: USB error -3 [OpenDevice] (<node>: Permission denied)"
 *    (the node the double tried is added where it is not the listed path). The real
 *    library prints it (as "I <file>:<line>] ...") only after edgetpu_verbosity(1), and
 *    retries a USB open for about 25 s first; the double prints it always, at once, and
 *    its edgetpu_verbosity does nothing. An open that passes the
 *    permission check but finds no driver behind the node (ENXIO: the test clusters'
 *    simulated USB nodes, harness/localcluster/hardware.py) counts as opened, with
 *    nothing to hold;
 *  - EDGETPU_DOUBLE_ROOT, when set, is where the double finds /sys and /dev: a path that
 *    begins with /sys/ or /dev/ (a USB stick's sysfs directory, its usbfs node, a PCIe path
 *    like /dev/apex_0) is looked for under it; "%n" in it is replaced by $SLURMD_NODENAME,
 *    so one value serves every node of a local cluster (<base>/nodes/%n); other paths (a
 *    local cluster's PCIe nodes, listed where the harness made them) are opened as they are;
 *  - every create/destroy appends one line to the file named by EDGETPU_DOUBLE_LOG:
 *    "<call> type=<usb|pci> path=<path> options=<k=v;...> pid=<pid>"; a failed open adds
 *    " node=<node> errno=<EACCES|ENOENT|...>" to its "open-failed" line;
 *  - its delegate claims no nodes (Prepare does nothing), so the model runs on the CPU.
 */
#include <errno.h>
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

/* What a created delegate remembers: the log line at destroy time, and the node it holds. */
typedef struct {
  TfLiteDelegate delegate;
  char type[8];
  char path[512];
  int fd; /* the device node, open until the delegate is freed; -1 when nothing is held */
} DoubleDelegate;

static int prepare_claims_nothing(void *context, TfLiteDelegate *delegate) {
  (void)context;
  (void)delegate;
  return 0; /* kTfLiteOk, and no ReplaceNodeSubsetsWithDelegateKernels call */
}

static void log_line_with(const char *call, const char *type, const char *path, const char *options,
                          const char *extra) {
  const char *log = getenv("EDGETPU_DOUBLE_LOG");
  if (!log || !*log) return;
  char line[2048];
  int n = snprintf(line, sizeof line, "%s type=%s path=%s options=%s pid=%d%s\n", call, type,
                   path, options, (int)getpid(), extra);
  if (n <= 0) return;
  if (n >= (int)sizeof line) n = sizeof line - 1;
  /* O_APPEND + one write(): lines from several processes never interleave. */
  int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  ssize_t ignored = write(fd, line, (size_t)n);
  (void)ignored;
  close(fd);
}

static void log_line(const char *call, const char *type, const char *path, const char *options) {
  log_line_with(call, type, path, options, "");
}

static const char *errno_name(int err) {
  switch (err) {
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case ENODEV: return "ENODEV";
    case ENXIO: return "ENXIO";
    case EBUSY: return "EBUSY";
    case ENOTDIR: return "ENOTDIR";
    default: return "EOTHER";
  }
}

/* `path` as the double finds it: under EDGETPU_DOUBLE_ROOT ("%n": $SLURMD_NODENAME) when it
 * begins with /sys/ or /dev/ and the variable is set, else as it is. */
static void under_root(char *out, size_t size, const char *path) {
  const char *root = getenv("EDGETPU_DOUBLE_ROOT");
  if (!root || !*root || (strncmp(path, "/sys/", 5) != 0 && strncmp(path, "/dev/", 5) != 0)) {
    snprintf(out, size, "%s", path);
    return;
  }
  const char *node = getenv("SLURMD_NODENAME");
  size_t used = 0;
  out[0] = '\0';
  for (const char *c = root; *c && used + 1 < size; c++) {
    const char *piece = c[0] == '%' && c[1] == 'n' ? (c++, node ? node : "") : NULL;
    size_t n = piece ? strlen(piece) : 1;
    if (used + n >= size) n = size - 1 - used;
    memcpy(out + used, piece ? piece : c, n);
    used += n;
    out[used] = '\0';
  }
  snprintf(out + used, size - used, "%s", path);
}

/* An integer sysfs attribute (busnum, devnum) of the USB device at `dir`; -1 when unreadable. */
static long sysfs_number(const char *dir, const char *name) {
  char file[1024];
  snprintf(file, sizeof file, "%s/%s", dir, name);
  FILE *handle = fopen(file, "r");
  if (!handle) return -1;
  long value = -1;
  if (fscanf(handle, "%ld", &value) != 1) value = -1;
  fclose(handle);
  return value;
}

/* Opens the device node behind a listed device, as the real library does; returns 0 with *fd
 * the open node (-1: permitted, but no driver answers a simulated node), else the errno, with
 * `node` naming what was tried and `why` the real library's words for it. */
static int open_device(const char *type, const char *path, int *fd, char *node, size_t node_size,
                       char *why, size_t why_size) {
  *fd = -1;
  int usb = strcmp(type, "usb") == 0;
  if (usb) {
    char dir[960]; /* room for "/busnum" in `node` */
    under_root(dir, sizeof dir, path);
    long bus = sysfs_number(dir, "busnum"), dev = sysfs_number(dir, "devnum");
    if (bus < 0 || dev < 0) {
      /* libusb enumerates no device at that port: LocalUsbDeviceFactory::OpenDevice. */
      snprintf(node, node_size, "%s/busnum", dir);
      snprintf(why, why_size, "Not found: OpenDevice");
      return ENOENT;
    }
    char usbfs[64];
    snprintf(usbfs, sizeof usbfs, "/dev/bus/usb/%03ld/%03ld", bus, dev);
    under_root(node, node_size, usbfs);
  } else {
    under_root(node, node_size, path);
  }
  int opened = open(node, O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (opened >= 0 || errno == ENXIO) {
    *fd = opened;
    return 0;
  }
  int err = errno;
  if (!usb) /* KernelRegisters::Open and its siblings in driver/kernel/. */
    snprintf(why, why_size, "Failed precondition: Device open failed : -1 (%s)", strerror(err));
  else if (err == EACCES || err == EPERM) /* libusb_open: LIBUSB_ERROR_ACCESS (ConvertLibUsbError) */
    snprintf(why, why_size, "Permission denied: USB error -3 [OpenDevice]");
  else if (err == ENOENT || err == ENODEV) /* LIBUSB_ERROR_NO_DEVICE */
    snprintf(why, why_size, "Unavailable: USB error -4 [OpenDevice]");
  else /* LIBUSB_ERROR_OTHER */
    snprintf(why, why_size, "Unknown: USB error -99 [OpenDevice]");
  return err;
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

/* Accepted and ignored: the double's one failure line is printed whatever the verbosity. */
void edgetpu_verbosity(int verbosity) { (void)verbosity; }

/* Says plainly what it is: `infer --benchmark` and `metrics` print this string. */
const char *edgetpu_version(void) { return "slurm-tpu test double of libedgetpu (no Edge TPU)"; }

static TfLiteDelegate *make_delegate(const char *type, const char *path, const char *options) {
  int fd;
  char node[1024], why[256];
  int err = open_device(type, path, &fd, node, sizeof node, why, sizeof why);
  if (err) {
    char tried[1100] = "";
    if (strcmp(node, path) != 0) snprintf(tried, sizeof tried, " (%s: %s)", node, strerror(err));
    fprintf(stderr, "E edgetpu_double.c] Failed to open device [%s] at [%s]: %s%s\n",
            strcmp(type, "usb") == 0 ? "Apex (USB)" : "Apex (PCIe)", path, why, tried);
    char extra[1200];
    snprintf(extra, sizeof extra, " node=%s errno=%s", node, errno_name(err));
    log_line_with("open-failed", type, path, options, extra);
    return NULL;
  }
  DoubleDelegate *d = calloc(1, sizeof *d);
  if (!d) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  d->fd = fd;
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
  if (d->fd >= 0) close(d->fd);
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
  int tried = 0;
  /* No type and no index: the first PCIe device, else the first USB one. */
  if (!colon && !wanted[0]) {
    for (size_t i = 0; i < count; i++)
      if (devices[i].type == EDGETPU_APEX_PCI) {
        strcpy(wanted, "pci");
        break;
      }
  }
  for (size_t i = 0; i < count && !tried; i++) {
    const char *type = devices[i].type == EDGETPU_APEX_PCI ? "pci" : "usb";
    if (wanted[0] && strcmp(wanted, type) != 0) continue;
    if (seen++ != index) continue;
    char joined[1024];
    join_options(joined, sizeof joined, (const char *const *)keys, (const char *const *)values, n);
    result = make_delegate(type, devices[i].path, joined); /* a failed open tries no other */
    tried = 1;
  }
  edgetpu_free_devices(devices);
  if (!tried && report_error) report_error("edgetpu double: no such device");
  return result;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate *delegate) { free_delegate(delegate, "destroy"); }
