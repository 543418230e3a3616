/*
 * slurm-tpu-hook-client: the hooks' thin client of the node's slurm-tpu agent, and
 * the hooks themselves without a shell.
 *
 *   slurm-tpu-hook-client HOOK STATE_DIR [-- FALLBACK ARGV...]
 *
 * Run as a native entry (below) by slurmd, or as slurm-tpu-hook-client by the udev hook's agent
 * path (root, started by udev). It hands the agent
 * (slurm_tpu/hooks/agent.py; the wire format: slurm_tpu/protocol/agent_wire.py) its
 * whole environment over STATE_DIR/agent.sock; the agent's worker runs the hook
 * and answers with the hook's messages, written here to stderr (slurmd's log, as
 * the Python hook's would be), and its exit status, which this exits with. No
 * job-controlled string is interpreted here: the environment is copied as bytes,
 * never given to a shell.
 *
 * Native entries: run under the name slurm-tpu-prolog-native, slurm-tpu-epilog-native
 * or slurm-tpu-task-prolog-native (hard links to this program, made beside the hook
 * of the same name without "-native": slurm_tpu/ops/hook_client.py), it is that
 * hook, for slurm.conf's Prolog=, Epilog=, TaskProlog=. It finds the state directory
 * (the one place in C that does) and hands it, in SLURM_TPU_STATE_DIR, to whoever it
 * asks or starts. The Prolog and Epilog ask the agent; with no agent socket, or an
 * environment too large for the agent, they exec the Python hook beside them
 * (prolog/slurm-tpu-prolog, epilog/slurm-tpu-epilog): the only two ways into a hook.
 * The TaskProlog prints the job's environment lines (prolog/slurm-tpu-task-prolog, its
 * sh twin for nodes without a compiler, says which, and why).
 *
 * When the agent's socket is there but nobody answers on it (the agent crashed), every
 * hook execs its FALLBACK (the Python hook, which shares the agent's ledger and lock) after
 * one line saying so; so does an environment too large for one request (a job can grow it
 * with SPANK_ variables). Fail closed: once the request is sent, no answer within the time
 * limit (SLURM_TPU_AGENT_TIMEOUT seconds in the environment slurmd gives, default 120) or an
 * agent that dies is status 1 with one line (a prolog: Slurm refuses the job); the agent's
 * worker then sees this client gone and
 * undoes a lease it took (agent.py: _client_gone).
 *
 * Built with the system cc (slurm_tpu/ops/hook_client.py) by scripts/setup.sh,
 * LocalCluster and slurm-tpu install;
 * without it slurm.conf names the Python hooks (and the sh task prolog).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <syslog.h>
#include <fcntl.h>
#include <unistd.h>

#define MAX_REQUEST (60 * 1024) /* slurm_tpu/protocol/agent_wire.py MAX_REQUEST is 64 KiB */
#define MAX_OUTPUT (64 * 1024)  /* slurm_tpu/protocol/agent_wire.py MAX_OUTPUT */
#define MAGIC "STPU1"
#define STATE_DIR_ENV "SLURM_TPU_STATE_DIR" /* slurm_tpu/defaults.py STATE_DIR_ENV */

extern char **environ;

/* One line, "slurm-tpu: HOOK: job N: WHAT" (+ what a failing prolog means), to stderr (slurmd logs a
 * failing hook's) and to syslog (the admin's trail, as the Python hooks' say() does). */
static void say(const char *hook, const char *what, const char *then)
{
    const char *job = getenv("SLURM_JOB_ID");
    char line[512];
    int n = snprintf(line, sizeof line, "slurm-tpu: %s: job %.20s: %s%s\n", hook, job ? job : "?", what, then);
    if (n <= 0)
        return;
    (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    openlog("slurm-tpu", LOG_PID, LOG_DAEMON);
    syslog(LOG_ERR, "%s: job %.20s: %s%s", hook, job ? job : "?", what, then);
    closelog();
}

static int fail(const char *hook, const char *what)
{
    /* A prolog that fails here leases nothing: Slurm refuses the job, the devices stay root's. */
    say(hook, what, strcmp(hook, "prolog") == 0 ? "; job refused, its devices stay with root" : "");
    return 1;
}

/* FALLBACK: the Python hook, after one line saying WHY the agent does not do the work. */
static int fallback(char **fallback_argv, const char *hook, const char *why)
{
    if (fallback_argv && fallback_argv[0]) {
        say(hook, why, "; the Python hook does the work");
        execv(fallback_argv[0], fallback_argv);
        return fail(hook, "cannot run the slower hook after the agent was unreachable");
    }
    return fail(hook, why);
}

/* Hand this process's environment to the agent behind PATH/agent.sock as HOOK's request; the
 * hook's status, or FALLBACK_ARGV's exec where the agent cannot take it (see the top). */
static int ask_agent(const char *hook, const char *path, char **fallback_argv)
{
    /* What this program found, for the agent's hook and the FALLBACK: neither reads the config for it. */
    if (setenv(STATE_DIR_ENV, path, 1) != 0)
        return fail(hook, "cannot hand the state directory on (out of memory)");

    /* The request: MAGIC \0 HOOK \0 then every NAME=value \0 of the environment. */
    static char buf[MAX_REQUEST];
    size_t len = 0;
    size_t need = sizeof MAGIC + strlen(hook) + 1;
    memcpy(buf, MAGIC, sizeof MAGIC);
    memcpy(buf + sizeof MAGIC, hook, strlen(hook) + 1);
    len = need;
    for (char **e = environ; *e; e++) {
        size_t n = strlen(*e) + 1;
        if (len + n > sizeof buf) /* a job can grow it (SPANK_ variables): the Python hook takes any size */
            return fallback(fallback_argv, hook, "the hook's environment is larger than the agent accepts (60 KiB)");
        memcpy(buf + len, *e, n);
        len += n;
    }

    long timeout_s = 120;
    const char *limit = getenv("SLURM_TPU_AGENT_TIMEOUT");
    if (limit && *limit) {
        char *end;
        long value = strtol(limit, &end, 10);
        if (*end == '\0' && value > 0 && value < 86400)
            timeout_s = value;
    }

    /* Through the directory's fd (as the agent binds): no sun_path length limit on STATE_DIR. */
    int dir = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* Only a root-owned directory no one else may write (as statedir._check_dir wants of it):
     * a socket anyone else could have put there is not asked. */
    struct stat dir_info;
    if (dir >= 0 && (fstat(dir, &dir_info) != 0 || dir_info.st_uid != 0 || (dir_info.st_mode & 022))) {
        close(dir);
        return fail(hook, "the state directory is not root's alone: not asking a socket in it");
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/agent.sock", dir);
    int sock = dir < 0 ? -1 : socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* The same limit on connecting and sending: an agent that stopped accepting fills its
     * listen backlog, and connect() on a full backlog would otherwise block until slurmd
     * kills the hook. Expired, connect fails with EAGAIN (treated like a dead agent). */
    struct timeval send_limit = {.tv_sec = timeout_s};
    if (sock >= 0)
        (void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0) {
        /* A socket nobody answers: the agent crashed (or hangs with a full backlog). Its hooks' work
         * is the Python hook's, on the same ledger under the same lock: it does it, slower, and the
         * line says why in slurmd's log (a job is not refused, nor a node drained, for a dead agent). */
        return fallback(fallback_argv, hook,
                        "the node's slurm-tpu agent does not answer on its socket (restart it: slurm-tpu-agent)");
    }

    /* The agent runs as root; anything else behind the socket is not it. */
    struct ucred peer;
    socklen_t peer_len = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer.uid != 0)
        return fail(hook, "the process behind the agent's socket is not root's");

    /* No descriptor travels: the agent's worker collects the hook's messages and sends them back,
     * so nothing of slurmd's (its output pipe) is ever held by another process. */
    uint32_t header = (uint32_t)len;
    struct iovec iov[2] = {{&header, sizeof header}, {buf, len}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (sent < 0)
        return fallback(fallback_argv, hook, "the node's slurm-tpu agent refused the request");
    /* A stream socket may take a large request in parts. */
    size_t total = sizeof header + len, done = (size_t)sent;
    while (done < total) {
        const char *from = done < sizeof header ? (const char *)&header + done : buf + (done - sizeof header);
        size_t left = done < sizeof header ? sizeof header - done : total - done;
        ssize_t n = send(sock, from, left, MSG_NOSIGNAL);
        if (n <= 0)
            return fail(hook, "the node's slurm-tpu agent went away while reading the request");
        done += (size_t)n;
    }

    /* The answer: a 4-byte length, the hook's messages (at most MAX_OUTPUT), one status byte. */
    static char answer[4 + MAX_OUTPUT + 1];
    size_t got = 0, want = 4 + 1;
    while (got < want) {
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int ready;
        do
            ready = poll(&pfd, 1, (int)(timeout_s * 1000));
        while (ready < 0 && errno == EINTR);
        if (ready == 0) {
            char why[160];
            snprintf(why, sizeof why, "the node's slurm-tpu agent did not answer within %ld s", timeout_s);
            return fail(hook, why);
        }
        ssize_t n = ready < 0 ? -1 : read(sock, answer + got, want - got);
        if (n <= 0)
            return fail(hook, "the node's slurm-tpu agent ended before it answered (see its log)");
        got += (size_t)n;
        if (got >= 4 && want == 4 + 1) {
            uint32_t size;
            memcpy(&size, answer, sizeof size);
            if (size > MAX_OUTPUT)
                return fail(hook, "the node's slurm-tpu agent sent a malformed answer");
            want = 4 + size + 1;
        }
    }
    size_t size = want - 5;
    for (size_t off = 0; off < size;) {  /* the hook's lines, to slurmd's log as the hook would */
        ssize_t n = write(2, answer + 4 + off, size - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    return (unsigned char)answer[want - 1];
}

/* ---- native entries: the hooks slurm.conf names, without an interpreter ------------------- */

/* slurm_tpu/defaults.py STATE_DIR, CONFIG_ENV, CONFIG_PATH (tests/test_fast_path.py checks they agree). */
#define DEFAULT_STATE_DIR "/run/slurm-tpu"
#define CONFIG_ENV "SLURM_TPU_CONFIG"
#define DEFAULT_CONFIG "/etc/slurm-tpu/config.yaml"
#define NATIVE_SUFFIX "-native"
#define MAX_FILE (1024 * 1024) /* a config or env file is read this far (both are a few hundred bytes) */

static const struct {
    const char *name, *hook;
} NATIVE[] = {
    {"slurm-tpu-prolog" NATIVE_SUFFIX, "prolog"},
    {"slurm-tpu-epilog" NATIVE_SUFFIX, "epilog"},
    {"slurm-tpu-task-prolog" NATIVE_SUFFIX, "task-prolog"},
};

/* Up to MAX_FILE bytes of the regular file at DIR/NAME (not through a final symlink), NUL-terminated
 * in a buffer of the caller's; its length, or -1. O_NONBLOCK: a FIFO put there never blocks the open. */
static ssize_t read_file(int dir, const char *name, char *buf, size_t size)
{
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat info;
    if (fd < 0)
        return -1;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    while (len < size - 1) {
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* The config's top-level "state_dir:" into OUT, as prolog/slurm-tpu-task-prolog and
 * slurm_tpu/hooks/settings.py scan_state_dir read it: the first line that starts with it, up to
 * a " #" comment, blanks trimmed, one pair of matching quotes removed; else the default. */
static void find_state_dir(char *out, size_t size)
{
    static char text[MAX_FILE];
    snprintf(out, size, "%s", DEFAULT_STATE_DIR);
    const char *config = getenv(CONFIG_ENV);
    if (!config || !*config)
        config = DEFAULT_CONFIG;
    ssize_t len = read_file(AT_FDCWD, config, text, sizeof text);
    for (char *line = text; len > 0 && line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end)
            end = text + len;
        *end = '\0';
        if (strncmp(line, "state_dir:", 10) == 0) {
            char *value = line + 10, *comment = strstr(value, " #");
            if (comment)
                *comment = '\0';
            while (*value && isspace((unsigned char)*value))
                value++;
            size_t n = strlen(value);
            while (n > 0 && isspace((unsigned char)value[n - 1]))
                n--;
            if (n >= 2 && value[0] == value[n - 1] && (value[0] == '"' || value[0] == '\'')) {
                value++;
                n -= 2;
            }
            snprintf(out, size, "%.*s", (int)n, value);
            return;
        }
        line = end + 1;
    }
}

/* prolog/slurm-tpu-task-prolog, natively: EDGETPU_VISIBLE_DEVICES empty, then the job's own lines
 * (export/unset SLURM_TPU_*, export EDGETPU_VISIBLE_DEVICES=) from STATE_DIR/jobs/<job>.env, else
 * from STATE_DIR/no-devices.env. Runs as the job's user; a file it cannot read is not there. */
static int task_prolog(const char *state_dir)
{
    static const char *const KEEP[] = {"export SLURM_TPU_", "unset SLURM_TPU_", "export EDGETPU_VISIBLE_DEVICES="};
    static char text[MAX_FILE], out[MAX_FILE + 64];
    size_t used = (size_t)snprintf(out, sizeof out, "export EDGETPU_VISIBLE_DEVICES=\n");
    const char *job = getenv("SLURM_JOB_ID");
    int valid = job && *job && strlen(job) <= 20 && strspn(job, "0123456789") == strlen(job);
    ssize_t len = -1;
    int dir = open(state_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        char name[64];
        if (valid) {
            snprintf(name, sizeof name, "jobs/%s.env", job);
            len = read_file(dir, name, text, sizeof text);
        }
        if (len < 0)
            len = read_file(dir, "no-devices.env", text, sizeof text);
        close(dir);
    }
    /* Whole lines only, as the sh task prolog's "while read" takes them (an unterminated last one is not). */
    for (char *line = text; len > 0 && line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end)
            break;
        size_t n = (size_t)(end - line) + 1;
        for (size_t k = 0; k < sizeof KEEP / sizeof *KEEP; k++) {
            if (n > strlen(KEEP[k]) && strncmp(line, KEEP[k], strlen(KEEP[k])) == 0 && used + n <= sizeof out) {
                memcpy(out + used, line, n);
                used += n;
                break;
            }
        }
        line = end + 1;
    }
    for (size_t off = 0; off < used;) {
        ssize_t n = write(1, out + off, used - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    return 0;
}

/* The native entry HOOK, run as SELF: the agent when its socket is there, else the Python hook. */
static int run_native(const char *hook, const char *self)
{
    char state_dir[4096], python_hook[4096];
    find_state_dir(state_dir, sizeof state_dir);
    if (strcmp(hook, "task-prolog") == 0)
        return task_prolog(state_dir);
    /* The Python hook of the same name: this program's path without "-native". */
    size_t n = strlen(self) - strlen(NATIVE_SUFFIX);
    snprintf(python_hook, sizeof python_hook, "%.*s", (int)n, self);
    char *hook_argv[] = {python_hook, NULL};
    struct stat info;
    int dir = open(state_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int agent = dir >= 0 && fstatat(dir, "agent.sock", &info, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(info.st_mode);
    if (dir >= 0)
        close(dir);
    if (!agent) { /* no agent on this node (or it was stopped): the Python hook does the work */
        if (setenv(STATE_DIR_ENV, state_dir, 1) == 0)
            execv(python_hook, hook_argv);
        return fail(hook, "no agent socket, and the Python hook beside this program cannot be run");
    }
    return ask_agent(hook, state_dir, hook_argv);
}

int main(int argc, char **argv)
{
    const char *self = argc > 0 ? argv[0] : "", *base = strrchr(self, '/');
    base = base ? base + 1 : self;
    for (size_t k = 0; k < sizeof NATIVE / sizeof *NATIVE; k++)
        if (strcmp(base, NATIVE[k].name) == 0)
            return run_native(NATIVE[k].hook, self);
    if (argc < 3 || strlen(argv[1]) > 16) {
        fprintf(stderr, "usage: slurm-tpu-hook-client HOOK STATE_DIR [-- FALLBACK...]\n");
        return 2;
    }
    return ask_agent(argv[1], argv[2], argc > 4 && strcmp(argv[3], "--") == 0 ? argv + 4 : NULL);
}
