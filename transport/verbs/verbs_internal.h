/*
 * verbs_internal.h - what verbs.c (engine, peers, data path, progress) and
 * verbs_dev.c (status mapping, devices, GIDs, QP state changes, side-channel
 * sockets) share.  Private to transport/verbs/.
 */
#ifndef KVR_VERBS_INTERNAL_H
#define KVR_VERBS_INTERNAL_H

#include "xfer_backend.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define COMP "verbs"

#define VB_MAX_DEV        4
#define VB_MAX_IP         8
#define VB_SQ_DEPTH       512 /* send WRs in flight per rail (KVR_VERBS_SQ_DEPTH) */
#define VB_RQ_DEPTH       64  /* notification receive buffers per inbound rail */
#define VB_NOTIF_SLOTS    64  /* notification send buffers per peer */
#define VB_NOTIF_BUF      KVR_XFER_NOTIF_MAX
#define VB_SIGNAL_EVERY   16 /* at most; sq_depth / 4 when smaller */
#define VB_STRIPE_PIECE   (1u << 20)
#define VB_MAX_WR_LEN     (1u << 30)
#define VB_CQ_BATCH       32
#define VB_HS_TIMEOUT_MS  10000      /* for the initiator's reply, and the target's request */
#define VB_INBOUND_MAX    1024       /* inbound side channels a target keeps */
#define VB_HS_PENDING_MAX 64         /* of them, waiting for their handshake request */
#define VB_TCP_TIMEOUT    1000       /* ms per side-channel address tried */
#define VB_POLL_EVERY_NS  1000000ull /* side channels and the devices' async events */
#define VB_MAX_ATTEMPTS   3          /* submissions of a part before its list fails */
#define VB_COOLDOWN_MS    1000 /* a failed rail's rest before a probe (KVR_VERBS_RAIL_COOLDOWN_MS) */
#define VB_HS_MAGIC       0x5652564bu /* "KVRV" */
#define VB_HS_VERSION     2 /* 2: conn, notifications on every rail with a sequence number */

/* ------------------------------------------------------------------------ */
/* objects                                                                   */

struct vb_dev {
    char name[64];
    uint8_t port;
    int gid_index;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan; /* CQ events, for kvr_xfer_event_fd() */
    union ibv_gid gid;
    uint32_t gid_type; /* enum ibv_gid_type */
    uint16_t lid;
    uint8_t link_layer;
    enum ibv_mtu mtu;
    uint32_t speed_mbps;
    uint32_t max_msg;
    uint32_t rd_atom;
    int numa;
    uint64_t port_errs; /* IBV_EVENT_PORT_ERR events seen on its port */
};

/* wire form of one device in the address blob */
struct vb_wire_dev {
    char name[64];
    uint8_t port, link_layer, mtu, pad;
    uint32_t gid_index, gid_type, speed_mbps;
    uint16_t lid, pad2;
    uint8_t gid[16];
} __attribute__((packed));

struct vb_wire_addr {
    uint32_t magic, version;
    uint64_t nonce;
    uint16_t tcp_port;
    uint8_t ndev, nip;
    uint8_t ip[VB_MAX_IP][4];
    char host[64];
    struct vb_wire_dev dev[VB_MAX_DEV];
} __attribute__((packed));

struct vb_wire_rail {
    uint32_t dev; /* request: target device; reply: 0 */
    uint32_t qpn, psn, mtu, rd_atom;
    uint16_t lid, pad;
    uint8_t gid[16];
} __attribute__((packed));

struct vb_hs {
    uint32_t magic, version;
    uint64_t nonce;
    int32_t status; /* reply */
    uint32_t nrails;
    char who[64];                      /* request: initiator name; reply: target name */
    char why[160];                     /* reply: the reason of a refusal */
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* request: the pair's token (xfer_token.c) */
    uint64_t conn; /* request: the initiator's connection (a probe names its own) */
    struct vb_wire_rail rail[VB_MAX_DEV];
} __attribute__((packed));

struct vb_inbound;
struct vb_peer;

struct vb_engine {
    struct kvr_xfer_engine base;
    int ndev;
    struct vb_dev dev[VB_MAX_DEV];
    int lfd;
    int efd; /* epoll set behind kvr_xfer_event_fd(); -1 until asked for */
    uint16_t lport;
    uint64_t nonce;
    uint32_t sq_depth;
    int nip;
    uint8_t ip[VB_MAX_IP][4];
    struct vb_inbound *inbound;
    struct vb_peer *peers;
    uint64_t last_poll_ns;
    uint32_t nheld;       /* notifications held by the inbounds, ahead of their turn */
    uint32_t cooldown_ms; /* failed rails rest this long before a probe */
    /* KVR_VERBS_FAIL_RAIL=R:N[,R:N]: rail R's QP is put in error before the post
     * that takes it past N WRs (a test of failover); UINT64_MAX: none */
    uint64_t inject_after[VB_MAX_DEV];
    char who[64]; /* "name pid N on host": names this end in the other's errors */
};

struct vb_mem {
    struct kvr_xfer_mem base;
    struct ibv_mr *mr[VB_MAX_DEV];
};

struct vb_rmem {
    struct kvr_xfer_rmem base;
    uint32_t nkey;
    uint32_t rkey[VB_MAX_DEV];
};

struct vb_dlist;

enum vb_item_kind { VB_ITEM_PART = 1, VB_ITEM_NOTIF = 2, VB_ITEM_FLUSH = 3 };

/* something waiting on a rail's FIFO */
struct vb_item {
    struct vb_item *next;
    int kind;
    bool queued;
};

/* the WRs of one list on one rail */
struct vb_part {
    struct vb_item item;
    struct vb_dlist *dl;
    uint32_t nwr, posted;
    struct ibv_send_wr *wr;
    struct ibv_sge *sge;
    struct vb_wref *ref; /* the regions of each WR: keys for another rail */
    int rail;            /* the rail its WRs carry the keys of (failover moves it) */
    uint32_t resume;     /* failover: its first WR not known to be complete */
    uint8_t attempts;    /* submissions of the current post */
    bool moving;
};

struct vb_wref {
    kvr_xfer_mem_t *l;
    kvr_xfer_rmem_t *r;
};

struct vb_notif {
    struct vb_item item;
    uint32_t slot, len;
    uint32_t seq;               /* 1, 2, ... per connection: the target drops a repeat */
    uint64_t fence[VB_MAX_DEV]; /* other rails: WRs enqueued on them before it (done_enq) */
};

/* what a send-queue slot belongs to */
struct vb_slot {
    struct vb_dlist *dl; /* NULL for a notification, or once the list was released */
    uint8_t kind;        /* VB_ITEM_PART, VB_ITEM_NOTIF or VB_ITEM_FLUSH */
    uint8_t end;         /* last WR of its part */
    uint8_t pi;          /* which part of dl (failover: not always this rail's) */
    uint32_t len;        /* data bytes of the WR (counted in bytes_done when retired) */
    uint32_t wi;         /* the WR's index in its part */
};

struct vb_rail {
    struct vb_peer *peer;
    int ldev, rdev;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    bool armed; /* CQ armed for an event (only with an event fd) */
    uint32_t psn;
    uint32_t weight;
    uint64_t posted, done, enq; /* WR counters: posted to the SQ, retired, enqueued */
    uint64_t done_enq;          /* enqueued WRs retired (done without the completion flushes) */
    uint64_t sig;               /* 1 + seq of the last signaled WR posted (0: none) */
    uint64_t flushes;           /* zero-length signaled WRITEs posted to cover a tail */
    bool down;                  /* failed over: carries nothing until a probe brings it back */
    uint8_t probe;              /* VB_PROBE_*: where the way back of a down rail is */
    bool port_down;             /* its port was down at the last probe time (logged once) */
    int pfd;                    /* the probe's side channel (a one-rail handshake), or -1 */
    uint64_t next_ns;           /* VB_PROBE_COOL: when to probe; HANDSHAKE: its deadline */
    uint64_t probe_seq;         /* VB_PROBE_CHECK: wr_id of the probing zero-length WRITE */
    size_t plen;
    struct vb_hs *prep;    /* the probe's handshake reply being read */
    uint64_t bytes;        /* data bytes posted on this rail */
    uint64_t bytes_done;   /* of those, retired as successful */
    uint64_t failovers;    /* times this rail failed and its transfers moved */
    struct vb_slot *slots; /* sq_depth, indexed by seq % sq_depth */
    struct vb_item *head, *tail;
};

enum vb_state { VB_CONNECTING = 0, VB_READY = 1, VB_FAILED = 2 };

/* a down rail: resting, then a one-rail handshake for a new QP, then a
 * signaled zero-length WRITE on it; its success brings the rail back */
enum { VB_PROBE_COOL = 0, VB_PROBE_HANDSHAKE = 1, VB_PROBE_CHECK = 2 };

struct vb_peer {
    struct kvr_xfer_peer base;
    struct vb_peer *next;
    int fd;
    enum vb_state state;
    uint64_t hs_deadline;
    size_t rlen;
    struct vb_hs reply;
    struct vb_wire_addr remote;
    int nrails;
    struct vb_rail rail[VB_MAX_DEV];
    char *nbuf; /* VB_NOTIF_SLOTS * VB_NOTIF_BUF, registered on every rail's device */
    struct ibv_mr *nmr[VB_MAX_DEV];
    uint64_t nb_head, nb_tail; /* notifications made / completed (in order) */
    int nr;                    /* the rail notifications go on: 0 until it fails */
    uint32_t nseq;             /* the last notification's sequence number */
    uint64_t conn;             /* this connection's id, in every handshake it makes */
    struct vb_notif nodes[VB_NOTIF_SLOTS];
    uint32_t mtu;
    char tstate[48]; /* the last state shown in the transports string */
};

struct vb_dlist {
    struct kvr_xfer_dlist base;
    int nparts;
    uint32_t left; /* parts of the current post not yet complete */
    kvr_status_t err;
    struct vb_part part[VB_MAX_DEV];
    void *mem;
};

/* an inbound connection on the target (no kvr_xfer_peer: the target never
 * called connect) */
struct vb_inbound {
    struct vb_inbound *next;
    struct vb_engine *eng;
    int fd;
    bool ready, dead;
    bool revoked; /* its token was revoked: nothing more delivered, closed */
    /* sent on the side channel before closing: 'E' QP error, 'S' shutdown,
     * 'V' its token revoked */
    char bye;
    uint64_t hs_deadline; /* its handshake request is due by then */
    size_t rlen;
    struct vb_hs req;
    uint32_t nseq; /* the last notification delivered of req.conn (shared by its inbounds) */
    /* notifications that came ahead of an earlier one of the connection
     * (another rail's CQ, or another of its inbounds, may hold that one
     * still): delivered in sequence once it was, their receive buffers
     * reposted then.  Bounded by the receive buffers posted. */
    uint32_t nheld;
    struct vb_held {
        uint32_t seq, len;
        uint16_t k;
        uint8_t rail;
    } held[VB_MAX_DEV * VB_RQ_DEPTH];
    int nrails;
    struct {
        int dev;
        struct ibv_cq *cq;
        struct ibv_qp *qp;
        bool armed; /* CQ armed for an event */
        bool dead;  /* a completion error: the initiator fails it over */
        char *rbuf; /* VB_RQ_DEPTH * VB_NOTIF_BUF: notifications may come on any rail */
        struct ibv_mr *rmr;
    } rail[VB_MAX_DEV];
};

#define ENG(e)   container_of((e), struct vb_engine, base)
#define PEER(p)  container_of((p), struct vb_peer, base)
#define MEM(m)   container_of((m), struct vb_mem, base)
#define RMEM(r)  container_of((r), struct vb_rmem, base)
#define DLIST(d) container_of((d), struct vb_dlist, base)

/* verbs_dev.c */
kvr_status_t kvr_verbs_status(int wc, int err);
const char *kvr_verbs_mtu_str(enum ibv_mtu m);
const char *kvr_verbs_gid_type_str(uint32_t t);
bool kvr_verbs_gid_v4(const uint8_t *g);
void kvr_verbs_gid_str(const uint8_t *g, char *buf, size_t cap);
uint32_t kvr_verbs_rand32(void);
kvr_status_t kvr_verbs_devices_open(struct vb_engine *ve);
void kvr_verbs_dev_close(struct vb_dev *d);
kvr_status_t kvr_verbs_listen(struct vb_engine *ve);
kvr_status_t kvr_verbs_qp_create(struct vb_engine *ve, int dev, uint32_t sq, uint32_t rq,
                                 bool *armed, struct ibv_cq **cq_p, struct ibv_qp **qp_p);
kvr_status_t kvr_verbs_qp_connect(struct vb_engine *ve, int dev, struct ibv_qp *qp,
                                  const struct vb_wire_rail *r, uint32_t mtu, uint32_t my_psn,
                                  uint32_t rd_atom);
void kvr_verbs_qp_to_error(struct ibv_qp *qp);
bool kvr_verbs_port_ready(struct vb_engine *ve, int dev, char *why, size_t cap);
kvr_status_t kvr_verbs_check_pair(const char *en, const struct vb_dev *l,
                                  const struct vb_wire_dev *r, const char *rhost);
int kvr_verbs_tcp_connect(const uint8_t ip[4], uint16_t port, int timeout_ms);
int kvr_verbs_send_all(int fd, const void *buf, size_t len, int timeout_ms);
int kvr_verbs_recv_some(int fd, void *buf, size_t *have, size_t want);

#endif
