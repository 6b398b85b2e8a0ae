/* SPDX-License-Identifier: MIT */
/*
 * auth.c - the token proof of every connection (auth.h has the exchange).
 * libsodium, not OpenSSL's libcrypto: the few primitives needed (keyed
 * hashing, HMAC, random bytes, a constant-time compare) with an API that
 * has no modes or engines to get wrong, and a small library to link.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <sodium.h>

#include "transport/base/auth.h"
#include "transport/base/frame.h"
#include "transport/base/log.h"

_Static_assert(FERRY_AUTH_MAC_LEN == crypto_auth_hmacsha512256_BYTES, "a proof is one HMAC");
_Static_assert(FERRY_AUTH_KEY_LEN == crypto_auth_hmacsha512256_KEYBYTES, "the key fits HMAC");
_Static_assert(FERRY_AUTH_FRAME_LEN == sizeof(struct ferry_msg_hdr) + FERRY_AUTH_NONCE_LEN,
	       "an AUTH frame is a header and a nonce");

static int auth_sodium(void)
{
	/* thread-safe, and cheap once it ran */
	if (sodium_init() < 0) {
		ferry_err("auth: libsodium failed to start (no entropy source?); the cluster "
			  "token cannot be used");
		return -ENOSYS;
	}
	return 0;
}

int ferry__auth_key_from_token(const void *token, size_t len, uint8_t *key)
{
	static const uint8_t label[] = "ferry cluster token v1";
	int rc = auth_sodium();

	if (rc)
		return rc;
	/* BLAKE2b keyed with a fixed label: the key is ours alone, never the token */
	crypto_generichash(key, FERRY_AUTH_KEY_LEN, token, len, label, sizeof(label) - 1);
	return 0;
}

static void auth_frame(uint8_t *out, uint8_t type, uint32_t src, const uint8_t *body)
{
	struct ferry_msg_hdr hdr;

	ferry__proto_hdr_init(&hdr, type, FERRY_AUTH_FRAME_LEN, src, 0);
	memcpy(out, &hdr, sizeof(hdr));
	memcpy(out + sizeof(hdr), body, FERRY_AUTH_NONCE_LEN);
}

/* @prover's proof over its nonce and the verifier's */
static void auth_mac(const struct ferry_auth_hs *h, int prover, const uint8_t *n_prover,
		     const uint8_t *n_verifier, uint8_t *mac)
{
	crypto_auth_hmacsha512256_state st;
	uint8_t role = prover == FERRY_AUTH_DIALER ? 'd' : 'a';

	crypto_auth_hmacsha512256_init(&st, h->key, FERRY_AUTH_KEY_LEN);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *)"ferry auth v1", 13);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *)h->svc, strlen(h->svc) + 1);
	crypto_auth_hmacsha512256_update(&st, &role, 1);
	crypto_auth_hmacsha512256_update(&st, n_prover, FERRY_AUTH_NONCE_LEN);
	crypto_auth_hmacsha512256_update(&st, n_verifier, FERRY_AUTH_NONCE_LEN);
	crypto_auth_hmacsha512256_final(&st, mac);
	sodium_memzero(&st, sizeof(st));
}

void ferry__auth_hs_init(struct ferry_auth_hs *h, const uint8_t *key, const char *svc, int role,
			 uint32_t src)
{
	memset(h, 0, sizeof(*h));
	h->key = key;
	h->svc = svc;
	h->role = role;
	if (auth_sodium())
		memset(h->nonce, 0, sizeof(h->nonce)); /* the peer's nonce still makes it fresh */
	else
		randombytes_buf(h->nonce, sizeof(h->nonce));
	auth_frame(h->out, FERRY_MSG_AUTH, src, h->nonce);
	h->out_len = FERRY_AUTH_FRAME_LEN;
}

void ferry__auth_mac(const uint8_t *key, const char *label, const void *const *parts,
		     const size_t *lens, int n, uint8_t *mac)
{
	crypto_auth_hmacsha512256_state st;

	crypto_auth_hmacsha512256_init(&st, key, FERRY_AUTH_KEY_LEN);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *)"ferry auth v1", 13);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *)label, strlen(label) + 1);
	for (int i = 0; i < n; i++)
		crypto_auth_hmacsha512256_update(&st, parts[i], lens[i]);
	crypto_auth_hmacsha512256_final(&st, mac);
	sodium_memzero(&st, sizeof(st));
}

int ferry__auth_equal(const void *a, const void *b, size_t len)
{
	return sodium_memcmp(a, b, len) == 0;
}

void ferry__auth_random(void *buf, size_t len)
{
	if (auth_sodium())
		memset(buf, 0, len); /* logged: then the tags are guessable, not wrong */
	else
		randombytes_buf(buf, len);
}

uint32_t ferry__auth_tag32(const uint8_t *key, uint64_t n)
{
	uint8_t out[crypto_shorthash_siphash24_BYTES];
	uint32_t v;

	crypto_shorthash_siphash24(out, (const uint8_t *)&n, sizeof(n), key);
	memcpy(&v, out, sizeof(v));
	return v;
}

void ferry__auth_wipe(void *buf, size_t len)
{
	sodium_memzero(buf, len);
}

int ferry__auth_looks_like(const void *buf, size_t len)
{
	struct ferry_msg_hdr hdr;

	if (len < 4)
		return 0;
	memset(&hdr, 0, sizeof(hdr));
	memcpy(&hdr, buf, len < sizeof(hdr) ? len : sizeof(hdr));
	return hdr.magic == FERRY_MSG_MAGIC && hdr.type == FERRY_MSG_AUTH;
}

/* is @f a frame of @type and the exchange's length? */
static int auth_frame_ok(const uint8_t *f, uint8_t type)
{
	struct ferry_msg_hdr hdr;

	memcpy(&hdr, f, sizeof(hdr));
	return hdr.magic == FERRY_MSG_MAGIC && hdr.version == FERRY_PROTO_VERSION &&
	       hdr.type == type && hdr.len == FERRY_AUTH_FRAME_LEN;
}

static int auth_refuse(struct ferry_auth_hs *h, const char *why)
{
	snprintf(h->why, sizeof(h->why), "%s", why);
	return -EACCES;
}

/* the whole of the peer's side is in: is its proof ours to expect? */
static int auth_verify(struct ferry_auth_hs *h)
{
	const size_t hdr_len = sizeof(struct ferry_msg_hdr);
	uint8_t mac[FERRY_AUTH_MAC_LEN];
	int peer = h->role == FERRY_AUTH_DIALER ? FERRY_AUTH_ACCEPTOR : FERRY_AUTH_DIALER;

	if (!auth_frame_ok(h->in + FERRY_AUTH_FRAME_LEN, FERRY_MSG_AUTH_PROOF))
		return auth_refuse(h, "its token proof is malformed");
	auth_mac(h, peer, h->in + hdr_len, h->nonce, mac);
	if (sodium_memcmp(mac, h->in + FERRY_AUTH_FRAME_LEN + hdr_len, FERRY_AUTH_MAC_LEN))
		return auth_refuse(h, "its token proof is wrong: it was started with another "
				      "FERRY_TOKEN, or it replays another connection's proof");
	return 0;
}

int ferry__auth_hs_step(struct ferry_auth_hs *h, int fd)
{
	const size_t hdr_len = sizeof(struct ferry_msg_hdr);
	ssize_t n;

	for (;;) {
		/* ours first, even to a peer about to be refused: it then hears why */
		while (h->out_off < h->out_len) {
			n = send(fd, h->out + h->out_off, h->out_len - h->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (n < 0)
				return -errno;
			h->out_off += (size_t)n;
		}
		if (h->in_off == FERRY_AUTH_HS_LEN) {
			int rc = auth_verify(h);

			if (rc)
				return rc;
			return h->out_off == h->out_len ? 1 : 0;
		}
		n = recv(fd, h->in + h->in_off, FERRY_AUTH_HS_LEN - h->in_off, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;
		h->in_off += (size_t)n;
		/* the peer's first frame, as soon as it is in: a stranger goes at once */
		if (h->in_off >= FERRY_AUTH_FRAME_LEN && h->out_len == FERRY_AUTH_FRAME_LEN) {
			uint8_t mac[FERRY_AUTH_MAC_LEN];

			if (!auth_frame_ok(h->in, FERRY_MSG_AUTH))
				return auth_refuse(
					h, ferry__auth_looks_like(h->in, h->in_off) ?
						   "its token proof is malformed" :
						   "it sent no token proof: was it started without "
						   "FERRY_TOKEN? every node needs the same one");
			auth_mac(h, h->role, h->nonce, h->in + hdr_len, mac);
			auth_frame(h->out + FERRY_AUTH_FRAME_LEN, FERRY_MSG_AUTH_PROOF, 0, mac);
			h->out_len = FERRY_AUTH_HS_LEN;
		}
	}
}
