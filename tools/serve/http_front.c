/* The HTTP guard's native front: the common request handled in C, every other one in Python.
 *
 * tools/serve/http_guard.py starts this process (tools/serve/http_front.py compiles it) with the
 * guard's listening socket and one end of a SOCK_SEQPACKET socketpair, the control channel. The
 * front accepts every connection and handles, itself, requests of the strict common subset:
 *
 *   - GET or POST, an origin-form target, HTTP/1.1, CRLF line endings, a head under 16 KiB with
 *     at most 100 fields, each `token ":" value` with no control byte, one Host, at most one
 *     Content-Length (digits, no leading zero) and one Inference-Header-Content-Length (not
 *     longer than the body), no field name with an underscore, no Transfer-Encoding, Expect,
 *     Content-Encoding or Upgrade;
 *   - a body of at most 64 KiB;
 *   - for an inference request, every "shape" in its JSON part read without a JSON parser (no
 *     backslash in it, each "shape" a list of digits) and holding no more elements than the
 *     body has bytes.
 *
 * Such a request goes to tritonserver with its head serialised anew from the parsed fields, as
 * the Python guard does, over one upstream connection per client connection, and the response
 * comes back framed (Content-Length, chunked, or until close). Anything else, valid or not, is
 * not judged here: at that request's boundary (nothing of it sent upstream) the connection is
 * handed, with the bytes read so far, to the Python guard over the control channel
 * (SCM_RIGHTS), which answers it and keeps the connection. So every refusal of a malformed
 * request is the Python guard's own, and this file only has to recognise the subset.
 *
 * Admission by latency target stays in Python (tools/serve/admission.py's LatencyLimit): this
 * front counts each model's requests and bytes in flight and refuses over the cap Python last
 * pushed (HTTP 503 with Retry-After, held REFUSAL_HOLD_S as the Python guard holds it), and
 * reports every completion (model, success, bytes, latency) in batches, from which Python
 * measures the throughput and the P99 that set the cap.
 *
 * Control channel, one message per packet, fields separated by tabs:
 *   front -> Python  H<bytes read so far>      with the connection's fd (SCM_RIGHTS)
 *                    M<model>                  a model seen for the first time
 *                    R<completion>...          completions (binary: see `completion`)
 *   Python -> front  T<model>\t<p99 ms, 0: no target>\t<cap bytes>\t<floor requests>\t<retry s>
 * The front exits when the channel closes (the Python guard is gone); SIGTERM and SIGINT are the
 * Python guard's to act on (it drains, then closes the channel).
 *
 *   cc -O2 -o http_front tools/serve/http_front.c -lm
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SMALL_BODY 65536             /* larger bodies: the Python guard (it budgets them) */
#define MAX_HEAD 16384               /* larger heads: the Python guard (414 / 431 are its) */
#define MAX_FIELDS 100
#define MAX_REQUEST_LINE 8192
#define IN_CAP (MAX_HEAD + 4 + SMALL_BODY + 4096)
#define OUT_PAUSE (1 << 20)          /* client output held before tritonserver is read no more */
#define MAX_RESPONSE_HEAD 65536
#define MAX_MODELS 1024
#define MAX_MODEL_NAME 200
#define MIN_IN_FLIGHT 4              /* admission.py */
#define COST_SHARE 0.02              /* admission.py */
#define REFUSAL_HOLD_S 0.2           /* http_guard.py */
#define MAX_HELD_REFUSALS 32         /* http_guard.py */
#define LINGER_S 1.0                 /* http_guard.py */
#define RECORDS_MAX 256              /* completions per report ... */
#define RECORDS_DELAY_S 0.25         /* ... or this long after the first (a Python wakeup each) */
#define CONTROL_MAX (IN_CAP + 64)

enum state { HEAD, BODY, WAITING, HOLDING, CLOSING };
enum relay { R_HEAD, R_LENGTH, R_CHUNK_SIZE, R_CHUNK_DATA, R_TRAILERS, R_UNTIL_CLOSE };

typedef struct {
  char *p;
  size_t len, off, cap;
} buffer;

typedef struct conn conn;
typedef struct {
  conn *c;
  int upstream;
} endpoint;

struct conn {
  int fd, up;
  uint32_t fd_events, up_events;
  endpoint client_end, upstream_end;
  enum state state;
  char *in;       /* what the client sent, not handled yet: grows to IN_CAP */
  size_t in_len, in_cap;
  /* the request being handled */
  size_t head_len, body_len;
  int close_after, model, counted, infer;
  long long json_len; /* Inference-Header-Content-Length, or -1: the whole body is JSON */
  double cost, started;
  buffer fwd;      /* the request as sent upstream (sent again once on a fresh connection) */
  size_t fwd_sent;
  int connecting, answered, retried;
  /* the response */
  buffer rbuf;     /* upstream bytes not framed yet */
  buffer out;      /* bytes for the client not written yet */
  enum relay relay;
  long long remaining;
  int status, keep_alive, eof;
  int shut_when_flushed, close_when_flushed, shut;
  double deadline;
  /* a refusal held (HOLDING) */
  double hold_until;
  char *held_answer;
  size_t held_len;
  int held_close;
  conn *hold_prev, *hold_next;
  conn *prev, *next;
};

typedef struct {
  char name[MAX_MODEL_NAME + 1];
  int known, has_target;
  double p99_ms, cap, floor_units, retry_after_s;
  long in_flight;
  double load, mean_cost;
} model_t;

static int epoll_fd, control_fd, listen_fd, upstream_port;
static double read_timeout_s = 30.0;
static model_t models[MAX_MODELS];
static int model_count;
static conn *all_conns;
static conn *held_first, *held_last;
static int held_count;
/* one completion as reported: the model's number (the order of its M message), whether it was
 * answered 200, its bytes, and when it was admitted and answered (CLOCK_MONOTONIC seconds) */
typedef struct {
  uint32_t model, ok;
  double cost, started, finished;
} completion;
static char records[1 + RECORDS_MAX * sizeof(completion)];
static size_t records_len;
static int records_count;
static double records_due;
static int closed_in_batch; /* a connection was freed: later events of the batch may name it */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fail(const char *what) {
  fprintf(stderr, "http front: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* ---- buffers */

static void put(buffer *b, const char *data, size_t size) {
  if (b->off && b->off == b->len) b->off = b->len = 0;
  if (b->len + size > b->cap) {
    if (b->off) {
      memmove(b->p, b->p + b->off, b->len - b->off);
      b->len -= b->off;
      b->off = 0;
    }
    if (b->len + size > b->cap) {
      size_t cap = b->cap ? b->cap : 4096;
      while (cap < b->len + size) cap *= 2;
      b->p = realloc(b->p, cap);
      if (!b->p) fail("out of memory");
      b->cap = cap;
    }
  }
  memcpy(b->p + b->len, data, size);
  b->len += size;
}

static size_t pending(const buffer *b) { return b->len - b->off; }

static void drop_bytes(buffer *b, size_t size) {
  b->off += size;
  if (b->off >= b->len) b->off = b->len = 0;
}

static void release_buffer(buffer *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* ---- control channel */

static void control_send(const char *data, size_t size, int fd) {
  struct iovec iov = {.iov_base = (void *)data, .iov_len = size};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  char cmsg_space[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    memset(cmsg_space, 0, sizeof cmsg_space);
    msg.msg_control = cmsg_space;
    msg.msg_controllen = sizeof cmsg_space;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  while (sendmsg(control_fd, &msg, MSG_NOSIGNAL) < 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == ENOBUFS) {
      usleep(200);
      continue;
    }
    exit(0); /* the Python guard is gone */
  }
}

static void flush_records(void) {
  if (!records_count) return;
  control_send(records, records_len, -1);
  records_len = 0;
  records_count = 0;
}

static void record(int model, int ok, double cost, double started, double finished) {
  if (!records_count) {
    records[0] = 'R';
    records_len = 1;
    records_due = finished + RECORDS_DELAY_S;
  }
  completion one = {(uint32_t)model, (uint32_t)ok, cost, started, finished};
  memcpy(records + records_len, &one, sizeof one);
  records_len += sizeof one;
  if (++records_count >= RECORDS_MAX) flush_records();
}

static int find_model(const char *name, size_t size) {
  for (int i = 0; i < model_count; i++)
    if (strlen(models[i].name) == size && !memcmp(models[i].name, name, size)) return i;
  return -1;
}

static int model_of(const char *name, size_t size) {
  int i = find_model(name, size);
  if (i >= 0) return i;
  if (model_count >= MAX_MODELS || size > MAX_MODEL_NAME) return -1;
  i = model_count++;
  memcpy(models[i].name, name, size);
  models[i].name[size] = 0;
  models[i].mean_cost = -1;
  char message[MAX_MODEL_NAME + 2] = "M";
  memcpy(message + 1, name, size);
  control_send(message, size + 1, -1);
  return i;
}

static void control_read(void) {
  static char message[4096];
  for (;;) {
    ssize_t got = recv(control_fd, message, sizeof message - 1, MSG_DONTWAIT);
    if (got == 0) exit(0); /* the Python guard is gone */
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      exit(0);
    }
    message[got] = 0;
    if (message[0] != 'T') continue;
    char *name = message + 1, *tab = strchr(name, '\t');
    if (!tab) continue;
    int i = find_model(name, tab - name);
    if (i < 0) continue;
    double p99, cap, floor_units, retry;
    if (sscanf(tab + 1, "%lf\t%lf\t%lf\t%lf", &p99, &cap, &floor_units, &retry) != 4) continue;
    model_t *m = &models[i];
    m->known = 1;
    m->has_target = p99 > 0;
    m->p99_ms = p99;
    m->cap = cap;
    m->floor_units = floor_units;
    m->retry_after_s = retry;
  }
}

/* ---- connections */

static void watch(int fd, uint32_t *current, uint32_t wanted, endpoint *end) {
  if (*current == wanted) return;
  struct epoll_event event = {.events = wanted, .data.ptr = end};
  epoll_ctl(epoll_fd, *current == (uint32_t)-1 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &event);
  *current = wanted;
}

/* Which events each socket of c waits for, from its state. */
static void update(conn *c) {
  uint32_t wanted = 0;
  int reading = !c->eof && (c->state == HEAD || c->state == BODY || c->in_len < IN_CAP);
  if (reading && c->state != CLOSING) wanted |= EPOLLIN;
  if (c->state == CLOSING && c->shut) wanted |= EPOLLIN; /* lingering: discard, see EOF */
  if (pending(&c->out)) wanted |= EPOLLOUT;
  watch(c->fd, &c->fd_events, wanted, &c->client_end);
  if (c->up >= 0) {
    wanted = 0;
    if (!c->connecting && pending(&c->out) < OUT_PAUSE) wanted |= EPOLLIN;
    if (c->connecting || c->fwd_sent < c->fwd.len) wanted |= EPOLLOUT;
    watch(c->up, &c->up_events, wanted, &c->upstream_end);
  }
}

static void unhold(conn *c) {
  if (c->hold_prev) c->hold_prev->hold_next = c->hold_next;
  else held_first = c->hold_next;
  if (c->hold_next) c->hold_next->hold_prev = c->hold_prev;
  else held_last = c->hold_prev;
  c->hold_prev = c->hold_next = NULL;
  held_count--;
  free(c->held_answer);
  c->held_answer = NULL;
}

static void close_upstream(conn *c) {
  if (c->up < 0) return;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->up, NULL);
  close(c->up);
  c->up = -1;
  c->up_events = (uint32_t)-1;
  c->connecting = 0;
  c->rbuf.len = c->rbuf.off = 0;
  c->relay = R_HEAD;
}

/* The request in flight is over: counted out of its model (ok: answered 200). */
static void finish(conn *c, int status) {
  if (!c->counted) return;
  c->counted = 0;
  model_t *m = &models[c->model];
  m->in_flight--;
  m->load = m->in_flight ? fmax(0.0, m->load - c->cost) : 0.0;
  record(c->model, status == 200, c->cost, c->started, now_s());
}

static void forget(conn *c, int close_fd) {
  closed_in_batch = 1;
  finish(c, 0);
  if (c->hold_prev || c->hold_next || held_first == c) unhold(c);
  close_upstream(c);
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
  if (close_fd) close(c->fd);
  if (c->prev) c->prev->next = c->next;
  else all_conns = c->next;
  if (c->next) c->next->prev = c->prev;
  release_buffer(&c->fwd);
  release_buffer(&c->rbuf);
  release_buffer(&c->out);
  free(c->in);
  free(c);
}

static void close_conn(conn *c) { forget(c, 1); }

/* The connection goes to the Python guard, with what it sent so far. */
static void hand_off(conn *c) {
  static char message[CONTROL_MAX];
  message[0] = 'H';
  memcpy(message + 1, c->in, c->in_len);
  int fd = c->fd;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, NULL);
  control_send(message, c->in_len + 1, fd);
  forget(c, 1);
}

/* Send what c->out holds; 0 when the connection was closed. */
static int flush_out(conn *c) {
  while (pending(&c->out)) {
    ssize_t n = send(c->fd, c->out.p + c->out.off, pending(&c->out), MSG_NOSIGNAL);
    if (n > 0) {
      drop_bytes(&c->out, n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    close_conn(c);
    return 0;
  }
  if (!pending(&c->out)) {
    if (c->close_when_flushed) {
      close_conn(c);
      return 0;
    }
    if (c->shut_when_flushed && !c->shut) {
      shutdown(c->fd, SHUT_WR);
      c->shut = 1;
    }
  }
  update(c);
  return 1;
}

static void json_escaped(buffer *b, const char *text) {
  for (; *text; text++) {
    if (*text == '"' || *text == '\\') put(b, "\\", 1);
    put(b, text, 1);
  }
}

/* An answer of the guard's own: HTTP status with {"error": message}. */
static void answer(buffer *b, int status, const char *reason, const char *message,
                   const char *retry_after, int close_it) {
  buffer body = {0};
  put(&body, "{\"error\": \"", 11);
  json_escaped(&body, message);
  put(&body, "\"}", 2);
  char head[512];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "%s%s%s%s\r\n",
                   status, reason, body.len, retry_after ? "Retry-After: " : "",
                   retry_after ? retry_after : "", retry_after ? "\r\n" : "",
                   close_it ? "Connection: close\r\n" : "");
  put(b, head, n);
  put(b, body.p, body.len);
  release_buffer(&body);
}

/* Answer with the guard's own response; closing ones half-close and linger (as http_guard). */
static int refuse(conn *c, const char *response, size_t size, int close_it) {
  put(&c->out, response, size);
  if (!close_it && !c->eof) {
    c->state = HEAD;
    c->deadline = now_s() + read_timeout_s;
    return flush_out(c);
  }
  c->state = CLOSING;
  c->in_len = 0;
  close_upstream(c);
  c->shut_when_flushed = 1;
  c->deadline = now_s() + LINGER_S;
  return flush_out(c);
}

static int fail_upstream(conn *c, const char *message) {
  finish(c, 0);
  buffer b = {0};
  answer(&b, 502, "Bad Gateway", message, NULL, 1);
  int alive = refuse(c, b.p, b.len, 1);
  release_buffer(&b);
  return alive;
}

static int connect_upstream(conn *c) {
  close_upstream(c);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail_upstream(c, "the guard could not open a socket to tritonserver");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(upstream_port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  c->up = fd;
  c->up_events = (uint32_t)-1;
  c->fwd_sent = 0;
  c->answered = 0;
  c->relay = R_HEAD;
  if (connect(fd, (struct sockaddr *)&to, sizeof to) < 0 && errno != EINPROGRESS) {
    char message[160];
    snprintf(message, sizeof message, "tritonserver is not answering on 127.0.0.1:%d (%s)",
             upstream_port, strerror(errno));
    close_upstream(c);
    return fail_upstream(c, message);
  }
  c->connecting = 1;
  update(c);
  return 1;
}

static int send_upstream(conn *c) {
  while (c->fwd_sent < c->fwd.len) {
    ssize_t n = send(c->up, c->fwd.p + c->fwd_sent, c->fwd.len - c->fwd_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c->fwd_sent += n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    break; /* the error shows as EOF or an error on reading */
  }
  update(c);
  return 1;
}

/* ---- the request subset */

static int is_tchar(unsigned char ch) {
  return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int is_vchar(unsigned char ch) { return ch == '\t' || (ch >= ' ' && ch != 127); }

static int name_is(const char *name, size_t size, const char *lower) {
  if (strlen(lower) != size) return 0;
  for (size_t i = 0; i < size; i++) {
    char ch = name[i];
    if (ch >= 'A' && ch <= 'Z') ch += 32;
    if (ch != lower[i]) return 0;
  }
  return 1;
}

/* digits only, 1-18 of them, no leading zero: the value, else -1 */
static long long plain_number(const char *text, size_t size) {
  if (!size || size > 18 || (text[0] == '0' && size > 1)) return -1;
  long long value = 0;
  for (size_t i = 0; i < size; i++) {
    if (text[i] < '0' || text[i] > '9') return -1;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

static void trim(const char **text, size_t *size) {
  while (*size && (**text == ' ' || **text == '\t')) (*text)++, (*size)--;
  while (*size && ((*text)[*size - 1] == ' ' || (*text)[*size - 1] == '\t')) (*size)--;
}

static int has_close_token(const char *value, size_t size) {
  size_t start = 0;
  for (size_t i = 0; i <= size; i++) {
    if (i == size || value[i] == ',') {
      const char *token = value + start;
      size_t length = i - start;
      trim(&token, &length);
      if (name_is(token, length, "close")) return 1;
      start = i + 1;
    }
  }
  return 0;
}

/* Parse the head c->in[0 .. end) (without its empty line) if it is in the subset, building the
 * head sent upstream into c->fwd. 0: not in the subset (the Python guard decides). */
static int parse_head(conn *c, size_t end) {
  const char *p = c->in, *stop = c->in + end;
  const char *line_end = memmem(p, end, "\r\n", 2);
  if (!line_end) line_end = stop;
  size_t line = line_end - p;
  if (line > MAX_REQUEST_LINE) return 0;
  size_t method;
  if (line > 4 && !memcmp(p, "GET ", 4)) method = 3;
  else if (line > 5 && !memcmp(p, "POST ", 5)) method = 4;
  else return 0;
  const char *target = p + method + 1, *space = memchr(target, ' ', line_end - target);
  if (!space || *target != '/' || line_end - space != 9 || memcmp(space, " HTTP/1.1", 9))
    return 0;
  for (const char *q = target; q < space; q++)
    if ((unsigned char)*q <= ' ' || (unsigned char)*q >= 127) return 0;
  size_t target_len = space - target;
  c->fwd.len = 0;
  put(&c->fwd, p, line);
  long long length = 0, header_length = -1;
  int hosts = 0, lengths = 0, fields = 0;
  c->close_after = 0;
  for (const char *q = line_end; q < stop;) {
    q += 2; /* the CRLF before this line */
    const char *e = memmem(q, stop - q, "\r\n", 2);
    if (!e) e = stop;
    if (++fields > MAX_FIELDS) return 0;
    const char *colon = q;
    while (colon < e && is_tchar((unsigned char)*colon)) colon++;
    if (colon == q || colon == e || *colon != ':') return 0;
    for (const char *v = colon + 1; v < e; v++)
      if (!is_vchar((unsigned char)*v)) return 0;
    const char *name = q, *value = colon + 1;
    size_t name_len = colon - q, value_len = e - value;
    if (memchr(name, '_', name_len)) return 0;
    trim(&value, &value_len);
    if (name_is(name, name_len, "content-length")) {
      if (lengths++ || (length = plain_number(value, value_len)) < 0) return 0;
    } else if (name_is(name, name_len, "host")) {
      if (hosts++) return 0;
    } else if (name_is(name, name_len, "inference-header-content-length")) {
      if (header_length >= 0 || (header_length = plain_number(value, value_len)) < 0) return 0;
    } else if (name_is(name, name_len, "transfer-encoding") || name_is(name, name_len, "expect") ||
               name_is(name, name_len, "content-encoding") || name_is(name, name_len, "upgrade")) {
      return 0;
    } else if (name_is(name, name_len, "connection")) {
      if (has_close_token(value, value_len)) c->close_after = 1;
    }
    put(&c->fwd, "\r\n", 2);
    put(&c->fwd, name, name_len);
    put(&c->fwd, ": ", 2);
    put(&c->fwd, value, value_len);
    q = e;
  }
  if (hosts != 1 || length > SMALL_BODY || header_length > length) return 0;
  put(&c->fwd, "\r\n\r\n", 4);
  c->body_len = (size_t)length;
  c->head_len = end + 4;
  /* an inference request: /v2/models/<model>[/versions/<v>]/infer */
  const char *query = memchr(target, '?', target_len);
  size_t path_len = query ? (size_t)(query - target) : target_len;
  c->infer = path_len >= 6 && !memcmp(target + path_len - 6, "/infer", 6);
  c->model = -1;
  if (c->infer && path_len > 11 && !memcmp(target, "/v2/models/", 11)) {
    const char *name = target + 11, *slash = memchr(name, '/', path_len - 11);
    size_t name_len = slash ? (size_t)(slash - name) : path_len - 11;
    c->model = model_of(name, name_len);
    if (c->model < 0) return 0;
  }
  c->json_len = header_length;
  return 1;
}

/* Whether the JSON string body raw[0 .. size) (between its quotes, with escapes) reads "shape"
 * once unescaped: a key written so would hide from the search for "shape" below. */
static int escaped_shape(const char *raw, size_t size) {
  char text[8];
  size_t length = 0;
  for (size_t i = 0; i < size; i++) {
    char ch = raw[i];
    if (ch == '\\') {
      if (++i >= size) return 0;
      switch (raw[i]) {
        case 'u': {
          if (i + 4 >= size) return 0;
          unsigned value = 0;
          for (int k = 1; k <= 4; k++) {
            char h = raw[i + k];
            value = value * 16 + (h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                  : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 1000);
          }
          if (value > 127) return 0; /* "shape" is ASCII */
          ch = (char)value;
          i += 4;
          break;
        }
        case 'n': ch = '\n'; break;
        case 't': ch = '\t'; break;
        case 'r': ch = '\r'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        default: ch = raw[i]; /* \" \\ \/ (and what no JSON parser accepts) */
      }
    }
    if (length >= 5) return 0;
    text[length++] = ch;
  }
  return length == 5 && !memcmp(text, "shape", 5);
}

/* Every "shape" of the JSON part holds at most `bytes` elements, read without a JSON parser:
 * 1 when so, 0 when that takes the Python guard (which parses the JSON, and may refuse).
 * Escapes are common in the data (json.dumps writes every non-ASCII character as \uXXXX), so a
 * string with one is unescaped only when it could spell "shape" (at most 6 bytes a character);
 * a JSON part whose strings do not end is the Python guard's. */
static int small_shapes(const char *json, size_t size, size_t bytes) {
  const char *p = json, *stop = json + size;
  for (const char *q = memchr(p, '"', size); q; q = memchr(q, '"', stop - q)) {
    const char *start = ++q;
    int escaped = 0;
    while (q < stop && *q != '"') {
      if (*q == '\\') {
        escaped = 1;
        if (++q >= stop) break;
      }
      q++;
    }
    if (q >= stop) return 0;
    if (escaped && q - start <= 30 && escaped_shape(start, q - start)) return 0;
    q++;
  }
  while ((p = memmem(p, stop - p, "\"shape\"", 7)) != NULL) {
    p += 7;
    while (p < stop && strchr(" \t\r\n", *p) && *p) p++;
    if (p >= stop || *p != ':') return 0;
    p++;
    while (p < stop && strchr(" \t\r\n", *p) && *p) p++;
    if (p >= stop || *p != '[') return 0;
    p++;
    const char *close = p;
    while (close < stop && *close && strchr("0123456789, \t\r\n", *close)) close++;
    if (close >= stop || *close != ']') return 0;
    int blank = 1, zero = 0, over = 0;
    for (const char *q = p; q < close; q++)
      if (*q >= '0' && *q <= '9') blank = 0;
    if (!blank) {
      double product = 1;
      for (const char *q = p; q <= close;) {
        const char *comma = q;
        while (comma < close && *comma != ',') comma++;
        const char *digit = q;
        size_t length = comma - q;
        while (length && strchr(" \t\r\n", *digit)) digit++, length--;
        while (length && strchr(" \t\r\n", digit[length - 1])) length--;
        if (!length) return 0; /* e.g. [1,,2] */
        double value = 0;
        for (size_t i = 0; i < length; i++) {
          if (digit[i] < '0' || digit[i] > '9') return 0; /* e.g. [1 2] */
          value = value * 10 + (digit[i] - '0');
        }
        if (value == 0) zero = 1;
        product *= value;
        if (product > (double)bytes) over = 1;
        q = comma + 1;
      }
      if (over && !zero) return 0;
    }
    p = close + 1;
  }
  return 1;
}

static void hold(conn *c, char *response, size_t size, int close_it) {
  c->state = HOLDING;
  c->held_answer = response;
  c->held_len = size;
  c->held_close = close_it;
  c->hold_until = now_s() + REFUSAL_HOLD_S;
  c->hold_prev = held_last;
  c->hold_next = NULL;
  if (held_last) held_last->hold_next = c;
  else held_first = c;
  held_last = c;
  held_count++;
}

/* Admit the request to its model, or answer 503 (held): 1 admitted, 0 refused, -1 closed. */
static int admit(conn *c) {
  if (c->model < 0) return 1;
  model_t *m = &models[c->model];
  if (!m->known || !m->has_target) return 1; /* as SloAdmission: no target, no count */
  double cost = c->body_len > 1 ? (double)c->body_len : 1.0;
  m->mean_cost = m->mean_cost < 0 ? cost : (1 - COST_SHARE) * m->mean_cost + COST_SHARE * cost;
  double cap = fmax(m->floor_units * m->mean_cost, m->cap);
  if (m->in_flight >= MIN_IN_FLIGHT && m->load + cost > cap) {
    char message[MAX_MODEL_NAME + 200], retry[32];
    snprintf(message, sizeof message,
             "model '%s' is over its latency target (%ld requests in flight, P99 objective "
             "%g ms); retry later", m->name, m->in_flight, m->p99_ms);
    double ceil_s = ceil(m->retry_after_s);
    snprintf(retry, sizeof retry, "%.0f", ceil_s < 1 ? 1.0 : ceil_s);
    buffer b = {0};
    answer(&b, 503, "Service Unavailable", message, retry, c->close_after);
    if (held_count < MAX_HELD_REFUSALS) {
      hold(c, b.p, b.len, c->close_after);
      update(c);
      return 0;
    }
    int alive = refuse(c, b.p, b.len, c->close_after);
    release_buffer(&b);
    return alive ? 0 : -1;
  }
  m->in_flight++;
  m->load += cost;
  c->counted = 1;
  c->cost = cost;
  c->started = now_s();
  return 1;
}

/* Handle what c->in holds: heads, bodies, pipelined requests, in order. 0: c is gone. */
static int advance(conn *c) {
  for (;;) {
    if (c->state == HEAD) {
      size_t skip = 0;
      while (skip + 1 < c->in_len && c->in[skip] == '\r' && c->in[skip + 1] == '\n') skip += 2;
      if (skip) {
        memmove(c->in, c->in + skip, c->in_len - skip);
        c->in_len -= skip;
      }
      char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
      if (!end) {
        /* a partial head: the Python guard refuses early what can never be one */
        int odd = c->in_len > MAX_HEAD;
        for (size_t i = 0; i < c->in_len && !odd; i++)
          if ((c->in[i] == '\n' && (i == 0 || c->in[i - 1] != '\r')) ||
              (c->in[i] == '\r' && i + 1 < c->in_len && c->in[i + 1] != '\n'))
            odd = 1;
        if (odd) {
          hand_off(c);
          return 0;
        }
        update(c);
        return 1;
      }
      if ((size_t)(end - c->in) > MAX_HEAD || !parse_head(c, end - c->in)) {
        hand_off(c);
        return 0;
      }
      c->state = BODY;
      c->deadline = now_s() + read_timeout_s;
    }
    if (c->state == BODY) {
      if (c->in_len < c->head_len + c->body_len) {
        update(c);
        return 1;
      }
      const char *body = c->in + c->head_len;
      if (c->infer && c->body_len) {
        size_t json = c->json_len >= 0 ? (size_t)c->json_len : c->body_len;
        if (!small_shapes(body, json, c->body_len)) {
          hand_off(c);
          return 0;
        }
      }
      put(&c->fwd, body, c->body_len);
      size_t used = c->head_len + c->body_len;
      memmove(c->in, c->in + used, c->in_len - used);
      c->in_len -= used;
      c->retried = 0;
      int admitted = admit(c); /* may answer, and close: after the request left c->in */
      if (admitted < 0) return 0;
      if (admitted == 0) {
        if (c->state == HOLDING) return 1;
        continue; /* answered at once; pipelined requests go on (or it closes) */
      }
      c->state = WAITING;
      if (c->up >= 0) {
        c->fwd_sent = 0;
        c->answered = 0;
        c->relay = R_HEAD;
        send_upstream(c);
      } else if (!connect_upstream(c)) {
        return 0;
      }
    }
    if (c->state != HEAD) {
      update(c);
      return 1;
    }
  }
}

/* ---- responses */

static void response_done(conn *c) {
  finish(c, c->status);
  c->retried = 0;
  c->relay = R_HEAD;
  if (pending(&c->rbuf)) { /* more than one response for one request */
    c->rbuf.len = c->rbuf.off = 0;
    c->keep_alive = 0;
  }
  if (!c->keep_alive || c->fwd_sent < c->fwd.len) close_upstream(c); /* (answered early) */
  if (c->close_after || c->eof || !c->keep_alive) {
    c->state = CLOSING;
    c->close_when_flushed = 1;
    flush_out(c);
    return;
  }
  c->state = HEAD;
  c->deadline = now_s() + read_timeout_s;
  if (!flush_out(c)) return;
  if (c->in_len) advance(c);
}

/* Frame a response head (with its empty line): -1 when it cannot be framed. */
static int frame(conn *c, const char *head, size_t size) {
  const char *e = memmem(head, size, "\r\n", 2);
  size_t line = e - head;
  if (line < 12 || memcmp(head, "HTTP/1.", 7) || (head[7] != '0' && head[7] != '1') ||
      head[8] != ' ' || head[9] < '0' || head[9] > '9' || head[10] < '0' || head[10] > '9' ||
      head[11] < '0' || head[11] > '9' || (line > 12 && head[12] != ' '))
    return -1;
  for (size_t i = 12; i < line; i++)
    if (head[i] == '\r' || head[i] == '\n') return -1;
  c->status = (head[9] - '0') * 100 + (head[10] - '0') * 10 + (head[11] - '0');
  long long length = -1;
  int chunked = 0;
  c->keep_alive = 1;
  const char *stop = head + size - 4;
  for (const char *q = e; q < stop;) {
    q += 2;
    const char *le = memmem(q, stop - q, "\r\n", 2);
    if (!le) le = stop;
    const char *colon = memchr(q, ':', le - q);
    if (colon) {
      const char *name = q, *value = colon + 1;
      size_t name_len = colon - q, value_len = le - value;
      trim(&name, &name_len);
      trim(&value, &value_len);
      if (name_is(name, name_len, "content-length")) {
        long long v = -1;
        if (length >= 0 || value_len == 0 || value_len > 18) return -1;
        v = 0;
        for (size_t i = 0; i < value_len; i++) {
          if (value[i] < '0' || value[i] > '9') return -1;
          v = v * 10 + (value[i] - '0');
        }
        length = v;
      } else if (name_is(name, name_len, "transfer-encoding")) {
        chunked = value_len >= 7 && name_is(value + value_len - 7, 7, "chunked");
      } else if (name_is(name, name_len, "connection")) {
        if (has_close_token(value, value_len)) c->keep_alive = 0;
      }
    }
    q = le;
  }
  if (c->status < 200 || c->status == 204 || c->status == 304) {
    c->relay = R_HEAD;
  } else if (chunked) {
    c->relay = R_CHUNK_SIZE;
  } else if (length >= 0) {
    c->relay = length ? R_LENGTH : R_HEAD;
    c->remaining = length;
  } else {
    c->relay = R_UNTIL_CLOSE;
    c->keep_alive = 0;
  }
  return 0;
}

/* Relay what rbuf holds; 1 a response ended, 0 more is needed, -1 unframeable. */
static int relay(conn *c) {
  buffer *b = &c->rbuf;
  while (pending(b)) {
    const char *p = b->p + b->off;
    size_t have = pending(b);
    if (c->relay == R_HEAD) {
      const char *end = memmem(p, have, "\r\n\r\n", 4);
      if (!end) return have > MAX_RESPONSE_HEAD ? -1 : 0;
      size_t size = end - p + 4;
      if (frame(c, p, size) < 0) return -1;
      put(&c->out, p, size);
      drop_bytes(b, size);
      if (c->relay == R_HEAD && c->status >= 200) return 1;
    } else if (c->relay == R_LENGTH || c->relay == R_CHUNK_DATA) {
      size_t take = have < (size_t)c->remaining ? have : (size_t)c->remaining;
      put(&c->out, p, take);
      drop_bytes(b, take);
      c->remaining -= take;
      if (!c->remaining) {
        if (c->relay == R_LENGTH) return 1;
        c->relay = R_CHUNK_SIZE;
      }
    } else if (c->relay == R_CHUNK_SIZE) {
      const char *end = memmem(p, have, "\r\n", 2);
      if (!end) return have > 4096 ? -1 : 0;
      char *after;
      long long size = strtoll(p, &after, 16);
      if (after == p || size < 0 || (after < end && *after != ';' && *after != ' ')) return -1;
      size_t line = end - p + 2;
      put(&c->out, p, line);
      drop_bytes(b, line);
      c->remaining = size + 2;
      c->relay = size ? R_CHUNK_DATA : R_TRAILERS;
    } else if (c->relay == R_TRAILERS) {
      const char *end = memmem(p, have, "\r\n", 2);
      if (!end) return have > MAX_RESPONSE_HEAD ? -1 : 0;
      size_t line = end - p + 2;
      put(&c->out, p, line);
      drop_bytes(b, line);
      if (line == 2) return 1;
    } else {
      put(&c->out, p, have);
      drop_bytes(b, have);
    }
  }
  return 0;
}

static void upstream_lost(conn *c) {
  int answered = c->answered, waiting = c->state == WAITING;
  if (waiting && c->relay == R_UNTIL_CLOSE && answered) {
    close_upstream(c);
    c->keep_alive = 0;
    response_done(c);
    return;
  }
  close_upstream(c);
  if (!waiting) {
    update(c);
    return;
  }
  if (answered) { /* mid-response: the client sees the connection end */
    c->state = CLOSING;
    c->close_when_flushed = 1;
    flush_out(c);
  } else if (!c->retried) { /* e.g. an idle kept-alive connection closed: once more, fresh */
    c->retried = 1;
    connect_upstream(c);
  } else {
    fail_upstream(c, "tritonserver closed the connection without answering");
  }
}

static void on_upstream(conn *c, uint32_t events) {
  if (c->connecting && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(c->up, SOL_SOCKET, SO_ERROR, &error, &size);
    c->connecting = 0;
    if (error) {
      char message[160];
      snprintf(message, sizeof message, "tritonserver is not answering on 127.0.0.1:%d (%s)",
               upstream_port, strerror(error));
      close_upstream(c);
      fail_upstream(c, message);
      return;
    }
    if (c->state != WAITING) {
      close_upstream(c);
      update(c);
      return;
    }
    c->fwd_sent = 0;
    send_upstream(c);
    return;
  }
  if (events & EPOLLOUT) send_upstream(c);
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  static char data[65536];
  ssize_t got = recv(c->up, data, sizeof data, 0);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (got <= 0) {
    upstream_lost(c);
    return;
  }
  if (c->state != WAITING) { /* bytes nobody asked for */
    close_upstream(c);
    update(c);
    return;
  }
  c->answered = 1;
  put(&c->rbuf, data, got);
  int done = relay(c);
  if (done < 0) { /* a response the guard cannot frame: end both connections */
    c->out.len = c->out.off = 0;
    close_conn(c);
    return;
  }
  if (done) {
    response_done(c);
    return;
  }
  flush_out(c);
}

static void on_client(conn *c, uint32_t events) {
  if (events & EPOLLOUT) {
    if (!flush_out(c)) return;
  }
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  if ((events & EPOLLERR) || ((events & EPOLLHUP) && !(events & EPOLLIN))) {
    close_conn(c); /* reset, or closed both ways: nothing more can be said to it */
    return;
  }
  if (c->state == CLOSING) { /* lingering, or closing: read and discard until EOF */
    char discard[4096];
    ssize_t got = recv(c->fd, discard, sizeof discard, 0);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) close_conn(c);
    return;
  }
  if (c->in_len >= IN_CAP) {
    update(c);
    return;
  }
  if (c->in_len == c->in_cap) { /* most connections never need more than the first 8 KiB */
    size_t cap = c->in_cap ? c->in_cap * 4 : 8192;
    c->in = realloc(c->in, cap < IN_CAP ? cap : IN_CAP);
    if (!c->in) fail("out of memory");
    c->in_cap = cap < IN_CAP ? cap : IN_CAP;
  }
  ssize_t got = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (got < 0) {
    close_conn(c);
    return;
  }
  if (got == 0) {
    c->eof = 1;
    if (c->state == WAITING || c->state == HOLDING) { /* half-closed: the answer still goes */
      update(c);
      return;
    }
    close_conn(c);
    return;
  }
  c->in_len += got;
  if (c->state == HEAD || c->state == BODY) advance(c);
  else update(c);
}

static void accept_all(void) {
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      return;
    }
    c->fd = fd;
    c->up = -1;
    c->fd_events = c->up_events = (uint32_t)-1;
    c->client_end.c = c->upstream_end.c = c;
    c->upstream_end.upstream = 1;
    c->state = HEAD;
    c->keep_alive = 1;
    c->deadline = now_s() + read_timeout_s;
    c->next = all_conns;
    if (all_conns) all_conns->prev = c;
    all_conns = c;
    update(c);
  }
}

static void release_holds(double now) {
  while (held_first && held_first->hold_until <= now) {
    conn *c = held_first;
    char *response = c->held_answer;
    size_t size = c->held_len;
    int close_it = c->held_close;
    c->held_answer = NULL;
    unhold(c);
    int alive = refuse(c, response, size, close_it);
    free(response);
    if (alive && c->state == HEAD && c->in_len) advance(c);
  }
}

static void sweep(double now) {
  for (conn *c = all_conns, *next; c; c = next) {
    next = c->next;
    if (c->deadline >= now) continue;
    if (c->state == HEAD && !c->in_len) {
      close_conn(c); /* an idle kept-alive connection */
    } else if (c->state == HEAD || c->state == BODY) {
      char message[120];
      snprintf(message, sizeof message, "request %s not received within %g s",
               c->state == HEAD ? "headers" : "body", read_timeout_s);
      buffer b = {0};
      answer(&b, 408, "Request Timeout", message, NULL, 1);
      refuse(c, b.p, b.len, 1);
      release_buffer(&b);
    } else if (c->state == CLOSING) {
      close_conn(c);
    } else if (c->state == WAITING) {
      c->deadline = now + read_timeout_s;
    }
  }
}

int main(int argc, char **argv) {
  listen_fd = control_fd = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--listen-fd")) listen_fd = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--control-fd")) control_fd = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--upstream-port")) upstream_port = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--read-timeout-s")) read_timeout_s = atof(argv[i + 1]);
  }
  if (listen_fd < 0 || control_fd < 0 || upstream_port <= 0 || read_timeout_s <= 0) {
    fprintf(stderr, "usage: http_front --listen-fd N --control-fd N --upstream-port U "
                    "[--read-timeout-s S] (started by tools/serve/http_guard.py)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGTERM, SIG_IGN); /* the Python guard drains, then closes the control channel */
  signal(SIGINT, SIG_IGN);
  fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) fail("epoll");
  static endpoint listener_end, control_end;
  struct epoll_event event = {.events = EPOLLIN, .data.ptr = &listener_end};
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &event)) fail("listening socket");
  event.data.ptr = &control_end;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, control_fd, &event)) fail("control channel");

  double sweep_every = read_timeout_s / 4 < 0.5 ? read_timeout_s / 4 : 0.5;
  double next_sweep = now_s() + sweep_every;
  struct epoll_event events[256];
  for (;;) {
    double now = now_s(), wake = next_sweep;
    if (held_first && held_first->hold_until < wake) wake = held_first->hold_until;
    if (records_count && records_due < wake) wake = records_due;
    int timeout = wake <= now ? 0 : (int)ceil((wake - now) * 1000);
    if (!all_conns && !records_count) timeout = -1; /* nothing to time out: sleep until asked */
    int n = epoll_wait(epoll_fd, events, 256, timeout);
    if (n < 0 && errno != EINTR) fail("epoll_wait");
    for (int i = 0; i < n; i++) {
      endpoint *end = events[i].data.ptr;
      if (end == &listener_end) {
        accept_all();
      } else if (end == &control_end) {
        control_read();
      } else if (end->upstream) {
        on_upstream(end->c, events[i].events);
      } else {
        on_client(end->c, events[i].events);
      }
      /* a connection closed above may have had events later in this batch: they name freed
       * memory, so the batch ends at the first close (what is left shows up again) */
      if (closed_in_batch) break;
    }
    closed_in_batch = 0;
    now = now_s();
    release_holds(now);
    if (records_count && records_due <= now) flush_records();
    if (now >= next_sweep || !all_conns) {
      sweep(now);
      next_sweep = now + sweep_every;
    }
  }
}
