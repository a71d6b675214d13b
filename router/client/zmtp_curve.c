/*
 * zmtp_curve.c - the client side of CurveZMQ (RFC 26; ZMTP 3.1's "CURVE"
 * mechanism, as libzmq speaks it) for libkvrail-client's direct router link
 * (zmtp_curve.h), with libsodium.  Command bodies in, command bodies out:
 * zmtp.c frames them and owns the socket.
 *
 * How it works.  Four key pairs: the client's long-term C and the router's
 * long-term public S (given), and per connection short-term C' (made by
 * kvr_zmtp_curve_hello) and S' (from the WELCOME).  Box[X](A->B) is
 * crypto_box from A's secret to B's public key under a 24-byte nonce; the
 * nonce is a 16-byte prefix naming the command plus an 8-byte counter
 * (short nonce, big-endian, from 1 per direction and connection), or an
 * 8-byte prefix plus 16 random bytes (long nonce):
 *
 *   HELLO     [5]HELLO 1 0, 72 zeros, C', short nonce, Box[64 zeros](C'->S)
 *             nonce "CurveZMQHELLO---"                               200 bytes
 *   WELCOME   [7]WELCOME, long nonce, Box[S' + cookie](S->C')         168 bytes
 *             nonce "WELCOME-"
 *   INITIATE  [8]INITIATE, cookie (96), short nonce,
 *             Box[C + vouch + metadata](C'->S'), nonce "CurveZMQINITIATE";
 *             vouch = long nonce + Box[C' + S](C->S'), nonce "VOUCH---"
 *   READY     [5]READY, short nonce, Box[metadata](S'->C'),
 *             nonce "CurveZMQREADY---"                              30+ bytes
 *   MESSAGE   [7]MESSAGE, short nonce, Box[flags + data],
 *             nonce "CurveZMQMESSAGEC" (ours) / "CurveZMQMESSAGES" (the router's)
 *
 * After the WELCOME, C'->S' boxes use the precomputed key
 * (crypto_box_beforenm).  The router's short nonces must rise strictly,
 * from its READY's on: a repeated or smaller one is a replay and refused.
 * MESSAGE boxes are sealed and opened in place (libsodium allows it): the
 * plaintext lies 32 bytes into the body, where the ciphertext goes, and
 * the MAC takes the 16 bytes before it.  Every size is checked before a
 * box is opened.  Secret keys are zeroed when a connection ends (C', the
 * precomputed key) and when the link is freed (all).
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "zmtp_curve.h"

#define NONCE_LEN   crypto_box_NONCEBYTES /* 24 */
#define MAC_LEN     crypto_box_MACBYTES   /* 16 */
#define COOKIE_LEN  96
#define META_MAX    256 /* our INITIATE metadata */
#define READY_MIN   (6 + 8 + MAC_LEN)
#define MESSAGE_HDR 16 /* [7]MESSAGE + short nonce */

_Static_assert(KVR_CURVE_MSG_OVERHEAD == MESSAGE_HDR + MAC_LEN + 1, "MESSAGE overhead");
_Static_assert(KVR_CURVE_KEY_LEN == crypto_box_PUBLICKEYBYTES &&
                   KVR_CURVE_KEY_LEN == crypto_box_SECRETKEYBYTES,
               "key sizes");

struct kvr_zmtp_curve {
    struct kvr_zmtp_curve_keys k;   /* long-term: C (pub, sec), S */
    uint8_t cn_pub[32], cn_sec[32]; /* this connection's C' */
    uint8_t cn_server[32];          /* its S' */
    uint8_t precom[crypto_box_BEFORENMBYTES];
    uint64_t nonce;      /* our next short nonce */
    uint64_t peer_nonce; /* the router's last short nonce (READY's, then MESSAGEs') */
};

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* A 24-byte nonce: a 16-byte prefix and an 8-byte short nonce. */
static void short_nonce(uint8_t n[NONCE_LEN], const char prefix[16], const uint8_t s[8])
{
    memcpy(n, prefix, 16);
    memcpy(n + 16, s, 8);
}

kvr_status_t kvr_zmtp_curve_create(const struct kvr_zmtp_curve_keys *keys, kvr_zmtp_curve_t **c_p)
{
    if (sodium_init() < 0)
        return KVR_ERR_IO;
    kvr_zmtp_curve_t *c = calloc(1, sizeof(*c));
    if (!c)
        return KVR_ERR_NO_MEMORY;
    c->k = *keys;
    *c_p = c;
    return KVR_OK;
}

void kvr_zmtp_curve_destroy(kvr_zmtp_curve_t *c)
{
    if (!c)
        return;
    sodium_memzero(c, sizeof(*c));
    free(c);
}

void kvr_zmtp_curve_end(kvr_zmtp_curve_t *c)
{
    sodium_memzero(c->cn_sec, sizeof(c->cn_sec));
    sodium_memzero(c->precom, sizeof(c->precom));
    sodium_memzero(c->cn_server, sizeof(c->cn_server));
    c->nonce = c->peer_nonce = 0;
}

kvr_status_t kvr_zmtp_curve_hello(kvr_zmtp_curve_t *c, uint8_t out[KVR_CURVE_HELLO_LEN])
{
    kvr_zmtp_curve_end(c);
    crypto_box_keypair(c->cn_pub, c->cn_sec);
    c->nonce = 1;
    memset(out, 0, KVR_CURVE_HELLO_LEN);
    memcpy(out, "\x05HELLO\x01\x00", 8); /* name, CurveZMQ 1.0; 72 zeros of padding follow */
    memcpy(out + 80, c->cn_pub, 32);
    put_u64(out + 112, c->nonce);
    uint8_t n[NONCE_LEN], zeros[64] = {0};
    short_nonce(n, "CurveZMQHELLO---", out + 112);
    if (crypto_box_easy(out + 120, zeros, sizeof(zeros), n, c->k.server, c->cn_sec) != 0)
        return KVR_ERR_INVALID; /* S is a low-order point: no key at all */
    c->nonce++;
    return KVR_OK;
}

size_t kvr_zmtp_curve_welcome(kvr_zmtp_curve_t *c, const uint8_t *body, size_t len,
                              uint8_t out[KVR_CURVE_INITIATE_MAX], char *err, size_t err_len)
{
    if (len != KVR_CURVE_WELCOME_LEN) {
        snprintf(err, err_len, "a WELCOME of %zu bytes (CurveZMQ's is %d)", len,
                 KVR_CURVE_WELCOME_LEN);
        return 0;
    }
    uint8_t n[NONCE_LEN], plain[32 + COOKIE_LEN];
    memcpy(n, "WELCOME-", 8);
    memcpy(n + 8, body + 8, 16);
    if (crypto_box_open_easy(plain, body + 24, KVR_CURVE_WELCOME_LEN - 24, n, c->k.server,
                             c->cn_sec) != 0) {
        snprintf(err, err_len,
                 "the router's CURVE key does not match KVRAIL_ROUTER_KEY: WELCOME box failed "
                 "to open");
        return 0;
    }
    memcpy(c->cn_server, plain, 32);
    if (crypto_box_beforenm(c->precom, c->cn_server, c->cn_sec) != 0) {
        snprintf(err, err_len, "the router's short-term key in its WELCOME is unusable");
        sodium_memzero(plain, sizeof(plain));
        return 0;
    }

    /* vouch = long nonce + Box[C' + S](C->S') */
    uint8_t vn[NONCE_LEN], vplain[64];
    memcpy(vn, "VOUCH---", 8);
    randombytes_buf(vn + 8, 16);
    memcpy(vplain, c->cn_pub, 32);
    memcpy(vplain + 32, c->k.server, 32);

    /* Box[C + vouch + metadata](C'->S'), its plaintext right where its
     * ciphertext goes (sealed in place) */
    static const char meta[] = "\x0bSocket-Type\x00\x00\x00\x06"
                               "DEALER";
    uint8_t *p = out;
    memcpy(p, "\x08INITIATE", 9);
    memcpy(p + 9, plain + 32, COOKIE_LEN);
    put_u64(p + 9 + COOKIE_LEN, c->nonce);
    uint8_t *box = p + 9 + COOKIE_LEN + 8, *ip = box + MAC_LEN;
    memcpy(ip, c->k.pub, 32);
    memcpy(ip + 32, vn + 8, 16);
    if (crypto_box_easy(ip + 48, vplain, sizeof(vplain), vn, c->cn_server, c->k.sec) != 0) {
        snprintf(err, err_len, "the router's short-term key in its WELCOME is unusable");
        sodium_memzero(plain, sizeof(plain));
        return 0;
    }
    memcpy(ip + 48 + 80, meta, sizeof(meta) - 1);
    size_t mlen = 32 + 16 + 80 + sizeof(meta) - 1;
    _Static_assert(9 + COOKIE_LEN + 8 + MAC_LEN + 128 + META_MAX <= KVR_CURVE_INITIATE_MAX,
                   "INITIATE room");
    uint8_t in[NONCE_LEN];
    short_nonce(in, "CurveZMQINITIATE", p + 9 + COOKIE_LEN);
    crypto_box_easy_afternm(box, ip, mlen, in, c->precom);
    c->nonce++;
    sodium_memzero(plain, sizeof(plain));
    return 9 + COOKIE_LEN + 8 + MAC_LEN + mlen;
}

kvr_status_t kvr_zmtp_curve_ready(kvr_zmtp_curve_t *c, uint8_t *body, size_t len,
                                  const uint8_t **meta_p, size_t *meta_len_p, char *err,
                                  size_t err_len)
{
    if (len < READY_MIN) {
        snprintf(err, err_len, "a CURVE READY of %zu bytes (at least %d)", len, READY_MIN);
        return KVR_ERR_CORRUPT;
    }
    uint8_t n[NONCE_LEN];
    short_nonce(n, "CurveZMQREADY---", body + 6);
    if (crypto_box_open_easy_afternm(body + 14 + MAC_LEN, body + 14, len - 14, n, c->precom) != 0) {
        snprintf(err, err_len,
                 "the router's READY box failed to open (not sealed with the short-term key "
                 "of its WELCOME)");
        return KVR_ERR_CORRUPT;
    }
    c->peer_nonce = get_u64(body + 6);
    *meta_p = body + 14 + MAC_LEN;
    *meta_len_p = len - 14 - MAC_LEN;
    return KVR_OK;
}

void kvr_zmtp_curve_seal(kvr_zmtp_curve_t *c, uint8_t *body, unsigned flags, const void *data,
                         size_t len)
{
    uint8_t *plain = body + MESSAGE_HDR + MAC_LEN;
    if (len && data != plain + 1)
        memmove(plain + 1, data, len);
    plain[0] = (uint8_t)flags;
    memcpy(body, "\x07MESSAGE", 8);
    put_u64(body + 8, c->nonce);
    uint8_t n[NONCE_LEN];
    short_nonce(n, "CurveZMQMESSAGEC", body + 8);
    crypto_box_easy_afternm(body + MESSAGE_HDR, plain, 1 + len, n, c->precom);
    c->nonce++;
}

kvr_status_t kvr_zmtp_curve_open(kvr_zmtp_curve_t *c, uint8_t *body, size_t len, unsigned *flags_p,
                                 const uint8_t **data_p, size_t *len_p, char *err, size_t err_len)
{
    if (len < 8 || memcmp(body, "\x07MESSAGE", 8) != 0) {
        char name[16] = "";
        size_t nl = len ? body[0] : 0;
        for (size_t i = 0; i < nl && i + 1 < len && i + 1 < sizeof(name); i++)
            name[i] = body[1 + i] >= 0x20 && body[1 + i] < 0x7f ? (char)body[1 + i] : '?';
        snprintf(err, err_len, "a '%s' where a CURVE MESSAGE was due", name);
        return KVR_ERR_CORRUPT;
    }
    if (len < KVR_CURVE_MSG_OVERHEAD) {
        snprintf(err, err_len, "a CURVE MESSAGE of %zu bytes (at least %d)", len,
                 KVR_CURVE_MSG_OVERHEAD);
        return KVR_ERR_CORRUPT;
    }
    uint64_t nonce = get_u64(body + 8);
    if (nonce <= c->peer_nonce) {
        snprintf(err, err_len,
                 "a CURVE MESSAGE with nonce %llu after %llu (a replay: nonces must rise)",
                 (unsigned long long)nonce, (unsigned long long)c->peer_nonce);
        return KVR_ERR_CORRUPT;
    }
    uint8_t n[NONCE_LEN];
    short_nonce(n, "CurveZMQMESSAGES", body + 8);
    uint8_t *plain = body + MESSAGE_HDR + MAC_LEN;
    if (crypto_box_open_easy_afternm(plain, body + MESSAGE_HDR, len - MESSAGE_HDR, n, c->precom) !=
        0) {
        snprintf(err, err_len, "a CURVE MESSAGE box failed to open (nonce %llu)",
                 (unsigned long long)nonce);
        return KVR_ERR_CORRUPT;
    }
    if (plain[0] & ~(KVR_CURVE_F_MORE | KVR_CURVE_F_COMMAND)) {
        snprintf(err, err_len, "a CURVE MESSAGE's flags 0x%02x have reserved bits set", plain[0]);
        return KVR_ERR_CORRUPT;
    }
    c->peer_nonce = nonce; /* only an authentic box moves the counter */
    *flags_p = plain[0];
    *data_p = plain + 1;
    *len_p = len - KVR_CURVE_MSG_OVERHEAD;
    return KVR_OK;
}
