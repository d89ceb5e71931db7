/*
 * Open-loop HTTP/1.1 load for overload runs, in C so that the load costs the shared cores
 * little: tools/load/native.py compiles it (cc -O2) and reads what it prints.
 *
 *   open_loop HOST PORT RATE DURATION_S CONNECTIONS TIMEOUT_S REQUESTS_FILE
 *
 * Request k (k = 0, 1, ...) is due at t0 + k / RATE while k / RATE < DURATION_S, and sends the
 * bytes of request k mod n of REQUESTS_FILE (each: a little-endian uint32 length, then that many
 * bytes: a whole HTTP/1.1 request). At most CONNECTIONS keep-alive connections, one request in
 * flight on each (as tools.load.senders.RawHttp); a request due while every connection is busy
 * waits for one, in order, and its latency counts from when it was due (no coordinated
 * omission). A request not answered TIMEOUT_S after it was sent fails ("client timeout") and
 * its connection is dropped; a broken connection fails its request and is reopened for the
 * next one. An answer must carry Content-Length (chunked answers fail the request).
 *
 * Prints "t0 SECONDS" (CLOCK_MONOTONIC, the clock of Python's time.monotonic), then one line per
 * request: "DUE_OFFSET_S LATENCY_MS STATUS BODY_HEX|-|ERROR" where STATUS 0 is a failure without
 * an answer (the last field then says why, with '_' for spaces), a 200 prints '-', and any other
 * status prints up to 4 KiB of its body in hex.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_BODY_HEX 4096
#define MAX_HEAD (64 * 1024)

enum { CLOSED, CONNECTING, IDLE, BUSY };

typedef struct {
    int fd, state;
    long request;          /* the request in flight, -1 */
    size_t sent;           /* bytes of it written */
    double deadline;       /* monotonic seconds */
    char *in;
    size_t in_len, in_cap;
} conn_t;

typedef struct {
    double latency_ms;
    int status;            /* -1: not finished */
    char *detail;          /* body hex, or the failure */
} result_t;

static const char **blobs;
static size_t *blob_len;
static size_t blob_count;
static double t0, rate;
static result_t *results;
static long *pending;      /* ring of due requests waiting for a connection */
static long pending_head, pending_tail;
static conn_t *conns;
static int conn_count, epfd;
static struct sockaddr_in address;
static double timeout_s;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "open_loop: %s: %s\n", what, strerror(errno));
    exit(2);
}

static double due_s(long k) { return t0 + k / rate; }

static void finish(long k, int status, char *detail) {
    results[k].latency_ms = (now_s() - due_s(k)) * 1000.0;
    results[k].status = status;
    results[k].detail = detail;
}

static char *hex_of(const char *data, size_t n) {
    static const char digits[] = "0123456789abcdef";
    if (n > MAX_BODY_HEX) n = MAX_BODY_HEX;
    char *out = malloc(2 * n + 2);
    if (n == 0) { strcpy(out, "-"); return out; }
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[(unsigned char)data[i] >> 4];
        out[2 * i + 1] = digits[(unsigned char)data[i] & 15];
    }
    out[2 * n] = 0;
    return out;
}

static void drop(conn_t *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->state = CLOSED;
    c->request = -1;
    c->in_len = 0;
}

static void fail(conn_t *c, const char *why) {
    if (c->request >= 0) finish(c->request, 0, strdup(why));
    drop(c);
}

static void write_more(conn_t *c) {
    long k = c->request;
    const char *data = blobs[k % blob_count];
    size_t n = blob_len[k % blob_count];
    while (c->sent < n) {
        /* MSG_NOSIGNAL: a connection the server closed fails its request, not the process */
        ssize_t w = send(c->fd, data + c->sent, n - c->sent, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
                return;
            }
            fail(c, "connection_broken_while_sending");
            return;
        }
        c->sent += (size_t)w;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void start(conn_t *c, long k, double now) {
    c->request = k;
    c->sent = 0;
    c->deadline = now + timeout_s;
    if (c->fd < 0) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
        if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0 && errno != EINPROGRESS) {
            fail(c, "connection_refused");
            return;
        }
        c->state = CONNECTING;
        return;
    }
    c->state = BUSY;
    write_more(c);
}

/* The header's value in a response head (case-insensitive name), or NULL. */
static const char *header(const char *head, size_t head_len, const char *name, size_t *len) {
    size_t name_len = strlen(name);
    const char *p = memchr(head, '\n', head_len);
    const char *end = head + head_len;
    while (p && p + 1 < end) {
        const char *line = p + 1;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if ((size_t)(eol - line) > name_len && line[name_len] == ':' &&
            strncasecmp(line, name, name_len) == 0) {
            const char *v = line + name_len + 1;
            while (v < eol && (*v == ' ' || *v == '\t')) v++;
            const char *e = eol;
            while (e > v && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
            *len = (size_t)(e - v);
            return v;
        }
        p = eol < end ? eol : NULL;
    }
    return NULL;
}

/* Parse what conn holds; true when its request is answered (or failed). */
static int parse(conn_t *c) {
    char *sep = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!sep) {
        if (c->in_len > MAX_HEAD) fail(c, "response_head_too_long");
        return c->state == CLOSED;
    }
    size_t head_len = (size_t)(sep - c->in) + 4;
    int status = 0;
    if (c->in_len < 12 || strncmp(c->in, "HTTP/1.", 7) != 0 ||
        sscanf(c->in + 9, "%3d", &status) != 1 || status < 100) {
        fail(c, "malformed_status_line");
        return 1;
    }
    size_t len;
    if (header(c->in, head_len, "transfer-encoding", &len)) {
        fail(c, "chunked_answer");
        return 1;
    }
    const char *cl = header(c->in, head_len, "content-length", &len);
    if (!cl) {
        fail(c, "answer_without_content-length");
        return 1;
    }
    size_t body_len = strtoul(cl, NULL, 10);
    if (c->in_len < head_len + body_len) return 0;
    const char *conn_hdr = header(c->in, head_len, "connection", &len);
    int close_after = conn_hdr && len == 5 && strncasecmp(conn_hdr, "close", 5) == 0;
    long k = c->request;
    finish(k, status, status == 200 ? strdup("-") : hex_of(c->in + head_len, body_len));
    c->request = -1;
    size_t used = head_len + body_len;
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
    if (close_after) drop(c);
    else c->state = IDLE;
    return 1;
}

static void readable(conn_t *c) {
    for (;;) {
        if (c->in_cap - c->in_len < 16384) {
            c->in_cap = c->in_cap ? 2 * c->in_cap : 65536;
            c->in = realloc(c->in, c->in_cap);
        }
        size_t room = c->in_cap - c->in_len;
        ssize_t r = read(c->fd, c->in + c->in_len, room);
        if (r > 0) {
            c->in_len += (size_t)r;
            if ((size_t)r < room) break;  /* drained for now */
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (c->state == BUSY || c->state == CONNECTING) fail(c, "connection_closed");
        else drop(c);  /* an idle keep-alive connection the server closed */
        return;
    }
    if (c->state == BUSY) parse(c);
    else if (c->state == IDLE && c->in_len) fail(c, "answer_without_request");
}

static void connected(conn_t *c) {
    int error = 0;
    socklen_t len = sizeof error;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error) {
        fail(c, "connection_refused");
        return;
    }
    c->state = BUSY;
    write_more(c);
}

static void read_requests(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    size_t cap = 16;
    blobs = malloc(cap * sizeof *blobs);
    blob_len = malloc(cap * sizeof *blob_len);
    uint8_t len_bytes[4];
    while (fread(len_bytes, 1, 4, f) == 4) {
        size_t n = len_bytes[0] | len_bytes[1] << 8 | len_bytes[2] << 16 | (size_t)len_bytes[3] << 24;
        char *data = malloc(n ? n : 1);
        if (fread(data, 1, n, f) != n) { fprintf(stderr, "open_loop: %s: truncated\n", path); exit(2); }
        if (blob_count == cap) {
            cap *= 2;
            blobs = realloc(blobs, cap * sizeof *blobs);
            blob_len = realloc(blob_len, cap * sizeof *blob_len);
        }
        blobs[blob_count] = data;
        blob_len[blob_count++] = n;
    }
    fclose(f);
    if (!blob_count) { fprintf(stderr, "open_loop: %s holds no request\n", path); exit(2); }
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: open_loop HOST PORT RATE DURATION_S CONNECTIONS TIMEOUT_S FILE\n");
        return 2;
    }
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons((uint16_t)atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1) {
        fprintf(stderr, "open_loop: not an IPv4 address: %s\n", argv[1]);
        return 2;
    }
    rate = atof(argv[3]);
    double duration = atof(argv[4]);
    conn_count = atoi(argv[5]);
    timeout_s = atof(argv[6]);
    if (rate <= 0 || duration <= 0 || conn_count < 1 || timeout_s <= 0) {
        fprintf(stderr, "open_loop: RATE, DURATION_S, CONNECTIONS and TIMEOUT_S must be > 0\n");
        return 2;
    }
    read_requests(argv[7]);
    long total = (long)ceil(rate * duration);
    while (total > 0 && (total - 1) / rate >= duration) total--;
    results = calloc((size_t)total + 1, sizeof *results);
    pending = malloc(((size_t)total + 1) * sizeof *pending);
    conns = calloc((size_t)conn_count, sizeof *conns);
    for (int i = 0; i < conn_count; i++) { conns[i].fd = -1; conns[i].request = -1; }
    for (long k = 0; k < total; k++) results[k].status = -1;
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) die("epoll_create1");
    struct epoll_event events[256];
    long next = 0, done = 0;  /* the next request due; the requests 0..done-1 are finished */
    int free_hint = 0;
    t0 = now_s();
    while (done < total) {
        double now = now_s();
        while (next < total && due_s(next) <= now) pending[pending_tail++] = next++;
        /* Hand due requests to free connections: idle ones first (kept alive), then closed. */
        while (pending_head < pending_tail) {
            conn_t *c = NULL;
            for (int i = 0; i < conn_count && !c; i++) {
                conn_t *d = &conns[(free_hint + i) % conn_count];
                if (d->state == IDLE) c = d;
            }
            for (int i = 0; i < conn_count && !c; i++)
                if (conns[i].state == CLOSED) c = &conns[i];
            if (!c) break;
            free_hint = (int)(c - conns);
            start(c, pending[pending_head++], now);
        }
        double wake = next < total ? due_s(next) : now + 1.0;
        for (int i = 0; i < conn_count; i++) {
            conn_t *c = &conns[i];
            if (c->state != BUSY && c->state != CONNECTING) continue;
            if (c->deadline <= now) fail(c, "client_timeout");
            else if (c->deadline < wake) wake = c->deadline;
        }
        /* The first request not finished yet (they finish out of order). */
        while (done < total && results[done].status != -1) done++;
        if (done >= total) break;
        if (pending_head < pending_tail) {
            int any_free = 0;
            for (int i = 0; i < conn_count && !any_free; i++)
                any_free = conns[i].state == IDLE || conns[i].state == CLOSED;
            if (any_free) continue;
        }
        int wait_ms = (int)ceil((wake - now_s()) * 1000.0);
        if (wait_ms < 0) wait_ms = 0;
        int n = epoll_wait(epfd, events, 256, wait_ms);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int i = 0; i < n; i++) {
            conn_t *c = events[i].data.ptr;
            if (c->fd < 0) continue;
            if (c->state == CONNECTING && (events[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
                connected(c);
                if (c->state != BUSY) continue;
            }
            if (c->state == BUSY && c->sent < blob_len[c->request % blob_count] &&
                (events[i].events & EPOLLOUT))
                write_more(c);
            if (c->fd >= 0 && (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
                readable(c);
        }
    }
    printf("t0 %.9f\n", t0);
    for (long k = 0; k < total; k++)
        printf("%.9f %.3f %d %s\n", k / rate, results[k].latency_ms, results[k].status,
               results[k].detail ? results[k].detail : "-");
    return 0;
}
