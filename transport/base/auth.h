/* SPDX-License-Identifier: MIT */
/*
 * auth.h - the cluster token, proven by every connection before anything
 * else is read from it (transport/base/: the bootstrap and the transports
 * share it). libsodium does the cryptography.
 *
 * The token (FERRY_TOKEN, FERRY_TOKEN_FILE or ferry_params.token) becomes a
 * 32-byte key (BLAKE2b of the token); the key never travels. Each end of a
 * connection sends a fresh random nonce at once, and, as soon as it has the
 * other's, a proof: HMAC-SHA-512-256 under the key of a label naming the
 * service, its own role (dialer or acceptor), its nonce and the other's.
 *
 *   dialer                                      acceptor
 *     AUTH{nonce_d}  ---------------------------->
 *                    <----------------------------  AUTH{nonce_a}
 *     AUTH_PROOF{mac(k, svc, "d", nonce_d, nonce_a)} ->
 *                    <----------------------------  AUTH_PROOF{mac(k, svc, "a",
 *                                                            nonce_a, nonce_d)}
 *   each checks the other's proof (constant time) before its first HELLO
 *
 * Both nonces are in both proofs, so a recorded proof is worth nothing on
 * another connection (the verifier's nonce is new), and the role in the
 * proof keeps an acceptor's proof from being reflected as a dialer's. The
 * exchange is exactly 2 x 48 bytes each way; what follows stays in the
 * socket for the service's own handshake.
 */
#ifndef FERRY_TRANSPORT_BASE_AUTH_H
#define FERRY_TRANSPORT_BASE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define FERRY_AUTH_KEY_LEN 32
#define FERRY_AUTH_NONCE_LEN 32
#define FERRY_AUTH_MAC_LEN 32
#define FERRY_AUTH_FRAME_LEN 48 /* a frame header and a nonce or a proof */
#define FERRY_AUTH_HS_LEN (2 * FERRY_AUTH_FRAME_LEN)

enum ferry_auth_role {
	FERRY_AUTH_DIALER = 0,
	FERRY_AUTH_ACCEPTOR = 1,
};

/* one end of the exchange on one connection; caller's memory */
struct ferry_auth_hs {
	const uint8_t *key; /* FERRY_AUTH_KEY_LEN bytes, outlives the exchange */
	const char *svc;    /* "bootstrap", "tcp": a proof counts for one service */
	int role;
	size_t out_off, out_len, in_off;
	uint8_t nonce[FERRY_AUTH_NONCE_LEN];
	uint8_t out[FERRY_AUTH_HS_LEN];
	uint8_t in[FERRY_AUTH_HS_LEN];
	char why[160]; /* after a refusal: what was wrong, for the log */
};

/**
 * ferry__auth_key_from_token - the key of a token
 * @token, @len: the secret, any bytes (len > 0)
 * @key: receives FERRY_AUTH_KEY_LEN bytes
 *
 * Context: any thread. Return: 0, or -ENOSYS when libsodium cannot start.
 */
int ferry__auth_key_from_token(const void *token, size_t len, uint8_t *key);

/**
 * ferry__auth_hs_init - start an exchange: draw our nonce, queue our AUTH
 * @key: FERRY_AUTH_KEY_LEN bytes; @svc: a static string; @role: ours
 * @src: the header's src field (our rank; 0 at the rendezvous)
 */
void ferry__auth_hs_init(struct ferry_auth_hs *h, const uint8_t *key, const char *svc, int role,
			 uint32_t src);

/**
 * ferry__auth_hs_step - move the exchange on over @fd (never blocks: it
 * reads and writes with MSG_DONTWAIT, and never reads past the exchange)
 *
 * Context: the thread that owns @fd. Return: 1 when the peer proved the key
 * and our proof is out; 0 while it goes on (wait for input, and for output
 * too when ferry__auth_hs_want_out()); -EACCES when the peer's frames are
 * not a proof of the key (h->why says what they were); -ENODATA when the
 * peer closed (h->in_off == 0: before sending anything); or a socket's
 * negative errno.
 */
int ferry__auth_hs_step(struct ferry_auth_hs *h, int fd);

/* the exchange has bytes to write that the socket did not take yet */
static inline int ferry__auth_hs_want_out(const struct ferry_auth_hs *h)
{
	return h->out_off < h->out_len;
}

/**
 * ferry__auth_mac - a MAC under @key of a label and the bytes of @n parts
 * (a proof for transports that have one message each way, rdma_cm)
 * @mac: receives FERRY_AUTH_MAC_LEN bytes
 */
void ferry__auth_mac(const uint8_t *key, const char *label, const void *const *parts,
		     const size_t *lens, int n, uint8_t *mac);

/* @a and @b hold the same @len bytes; constant time. Return: 1 or 0 */
int ferry__auth_equal(const void *a, const void *b, size_t len);

/* @len random bytes (libsodium's generator) */
void ferry__auth_random(void *buf, size_t len);

/* 32 bits of SipHash-2-4 of @n under @key (16 bytes): tags a peer cannot
 * guess without the key, cheap enough for one per key moved */
uint32_t ferry__auth_tag32(const uint8_t *key, uint64_t n);

/* zero @len bytes of a secret in a way the compiler keeps */
void ferry__auth_wipe(void *buf, size_t len);

/* @buf (at least 4 bytes) starts like an AUTH frame: the peer has a token */
int ferry__auth_looks_like(const void *buf, size_t len);

#endif /* FERRY_TRANSPORT_BASE_AUTH_H */
