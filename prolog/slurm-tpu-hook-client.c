/*
 * slurm-tpu-hook-client: the hooks' thin client of the node's slurm-tpu agent.
 *
 *   slurm-tpu-hook-client HOOK STATE_DIR [-- FALLBACK ARGV...]
 *
 * Run by prolog/slurm-tpu-prolog, epilog/slurm-tpu-epilog and the udev hook's
 * agent path (root, started by slurmd or udev). It hands the agent
 * (slurm_tpu/hooks/agent.py; the wire format: slurm_tpu/protocol/agent_wire.py) its
 * whole environment over STATE_DIR/agent.sock; the agent's worker runs the hook
 * and answers with the hook's messages, written here to stderr (slurmd's log, as
 * the Python hook's would be), and its exit status, which this exits with. No
 * job-controlled string is interpreted here: the environment is copied as bytes,
 * never given to a shell.
 *
 * Fail closed: when the agent cannot be reached, the prolog prints one line and
 * its status is 1 (Slurm refuses the job, the devices stay root's); the epilog
 * and the udev hook exec their FALLBACK (the Python hook), which gives the
 * devices back. An environment too large for one request (a job can grow it
 * with SPANK_ variables) execs the FALLBACK for every hook. Once the
 * request is sent, no answer within the time limit (SLURM_TPU_AGENT_TIMEOUT
 * seconds in the environment slurmd gives, default 120) or an agent that dies
 * is status 1 with one line; the agent's worker then sees this client gone and
 * undoes a lease it took (agent.py: _client_gone).
 *
 * Built with the system cc (slurm_tpu/ops/hook_client.py) by scripts/setup.sh,
 * LocalCluster, and the agent itself beside installed hooks; without it the sh
 * hooks run the Python hooks as before.
 */
#define _GNU_SOURCE
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
#include <fcntl.h>
#include <unistd.h>

#define MAX_REQUEST (60 * 1024) /* slurm_tpu/protocol/agent_wire.py MAX_REQUEST is 64 KiB */
#define MAX_OUTPUT (64 * 1024)  /* slurm_tpu/protocol/agent_wire.py MAX_OUTPUT */
#define MAGIC "STPU1"

extern char **environ;

static int fail(const char *hook, const char *what)
{
    const char *job = getenv("SLURM_JOB_ID");
    char line[512];
    /* A prolog that fails here leases nothing: Slurm refuses the job, the devices stay root's. */
    int n = snprintf(line, sizeof line, "slurm-tpu: %s: job %.20s: %s%s\n", hook, job ? job : "?", what,
                     strcmp(hook, "prolog") == 0 ? "; job refused, its devices stay with root" : "");
    if (n > 0)
        (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    return 1;
}

static int fallback(char **argv, int at, const char *hook, const char *why)
{
    if (at > 0 && argv[at]) {
        execv(argv[at], argv + at);
        return fail(hook, "cannot run the Python hook after the agent was unreachable");
    }
    return fail(hook, why);
}

int main(int argc, char **argv)
{
    if (argc < 3 || strlen(argv[1]) > 16) {
        fprintf(stderr, "usage: slurm-tpu-hook-client HOOK STATE_DIR [-- FALLBACK...]\n");
        return 2;
    }
    const char *hook = argv[1], *path = argv[2];
    int fb = 0;
    if (argc > 4 && strcmp(argv[3], "--") == 0)
        fb = 4;

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
            return fallback(argv, fb, hook, "the hook's environment is larger than the agent accepts (60 KiB)");
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
        /* A socket nobody answers: the agent crashed. The prolog refuses the job (fail closed);
         * the epilog and the udev hook give devices back, so their Python hooks do it instead. */
        static const char *dead = "the node's slurm-tpu agent does not answer on its socket "
                                  "(restart it: slurm-tpu-agent)";
        return strcmp(hook, "prolog") == 0 ? fail(hook, dead) : fallback(argv, fb, hook, dead);
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
        return fallback(argv, fb, hook, "the node's slurm-tpu agent refused the request");
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
