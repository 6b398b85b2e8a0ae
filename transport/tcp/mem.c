/* SPDX-License-Identifier: MIT */
/*
 * mem.c - the memory of the tcp transport's buffers: the send log's chunks
 * and the connections' receive buffers, and the trim that gives it back
 * once a burst is over, so that what a node holds for its connections
 * follows what is in flight, not the largest burst it ever saw.
 *
 * A receive buffer is a mapping of its own (mmap), so that a trim can drop
 * its pages in place (MADV_DONTNEED). It grows by a new mapping and a copy
 * of what is unread, not by mremap: TSan does not intercept mremap, and
 * reported a race on the first bytes of a buffer that mremap had moved to
 * where another node's thread once wrote (recv() writes it unseen by TSan,
 * so the stale history stood). Log chunks come from malloc: as
 * mappings of their own, ferry-bench's remote push-batch100 of 4 KiB values
 * took 2.5x as long (p50 515-770 us against 184-251). The core builds
 * each frame in a buffer it mallocs and frees; the run made 1826 brk calls
 * against 47 (strace -c, the trim off), so malloc gave its heap's top back
 * and faulted it in again around the frames: with no large chunk of ours
 * freed, glibc's dynamic mmap and trim thresholds stay at their floor (our
 * reading). What a trim frees of the chunks goes back to the kernel
 * through malloc_trim (below).
 *
 * Policy and bound, per connection (B = the largest frame in flight):
 *
 *   send log   the chunks holding frames the peer has not acknowledged:
 *              at most FERRY_TP_SENDQ_MAX + B, in TCP_CHUNK_SIZE steps
 *              (send.c: senders wait for room beyond that).
 *   pool       acknowledged chunks kept for reuse (a stream of large frames
 *              then faults no fresh pages): never more than TCP_SPARE_MAX,
 *              and after each trim no more than the log's peak since the
 *              trim before, less what the log holds now. So the log and the
 *              pool together hold no more than the log's peak over the
 *              last two trim windows (the pool capped at TCP_SPARE_MAX).
 *   receive    TCP_RBUF_SIZE, or the largest frame being received +
 *              TCP_RBUF_SIZE (recv.c). A trim that finds it empty, with no
 *              frame above TCP_RBUF_SIZE / 2 since the trim before, frees
 *              a grown one and drops the pages of one of TCP_RBUF_SIZE
 *              (MADV_DONTNEED: resident 0, the next bytes fault fresh zero
 *              pages in); while large frames come it is left whole.
 *
 *   The trim runs on the progress thread, TCP_TRIM_MS after something was
 *   left to trim (a chunk went to the pool, bytes came in) and then every
 *   TCP_TRIM_MS while something is; it is not armed on an idle transport.
 *   Once a burst is over (its frames read and acknowledged), the pool is
 *   back within two trims (2 x TCP_TRIM_MS) to what the traffic since needs
 *   (0 when there is none), and an empty receive buffer within one trim to
 *   no resident pages: an idle connection holds none of its buffers' memory.
 *
 *     burst          quiet                 quiet
 *   |------------|--------------------|--------------------|
 *   log+pool up  trim: pool <= peak   trim: pool <= the quiet window's
 *   to the burst of the burst window  peak - log (0 with no traffic)
 *
 * When a trim frees TCP_TRIM_HEAP bytes or more of pool chunks and grown
 * receive buffers (a burst ended; steady traffic keeps its pool and frees
 * little), it also asks glibc's malloc to return the free memory the burst
 * left in its heap (malloc_trim, 0.05-1 ms measured; at most once per
 * TCP_TRIM_MS): the log's chunks, the core's frames and per-key records of
 * the burst were malloc'd and freed, and malloc would keep them.
 *
 * ferry__tcp_mem_held() adds it up (the log's and pool's chunks at their
 * capacity, the receive buffer's pages written since they were last
 * dropped): what ferry_stats() reports as tp_buffer_bytes.
 */
#define _GNU_SOURCE /* like every file of the transport (tcp.h) */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"

/* called at most once per trim, resize or mem_held: no need to cache it */
static size_t tcp_page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

size_t ferry__tcp_chunk_cap(size_t total)
{
	/* whole TCP_CHUNK_SIZEs: frames of one size range reuse each other's */
	return (sizeof(struct tcp_chunk) + total + TCP_CHUNK_SIZE - 1) / TCP_CHUNK_SIZE *
		       TCP_CHUNK_SIZE -
	       sizeof(struct tcp_chunk);
}

struct tcp_chunk *ferry__tcp_chunk_new(size_t total)
{
	size_t len = sizeof(struct tcp_chunk) + ferry__tcp_chunk_cap(total);
	struct tcp_chunk *ch;

	ch = malloc(len);
	if (!ch)
		return NULL;
	ch->cap = len - sizeof(*ch);
	return ch;
}

void ferry__tcp_chunk_free(struct tcp_chunk *ch)
{
	free(ch);
}

int ferry__tcp_rbuf_resize(struct tcp_conn *c, size_t want)
{
	size_t pg = tcp_page();
	void *p;

	want = (want + pg - 1) / pg * pg;
	/* growth is rare (a frame larger than the buffer) and copies only
	 * what is unread: not mremap, which TSan does not intercept (below) */
	p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -ENOMEM;
	if (c->rbuf) {
		memcpy(p, c->rbuf + c->rhead, c->rtail - c->rhead);
		c->rtail -= c->rhead;
		c->rhead = 0;
		munmap(c->rbuf, c->rcap);
	}
	c->rbuf = p;
	c->rcap = want;
	__atomic_store_n(&c->rtouched, c->rtail, __ATOMIC_RELAXED);
	return 0;
}

void ferry__tcp_rbuf_free(struct tcp_conn *c)
{
	if (c->rbuf)
		munmap(c->rbuf, c->rcap);
	c->rbuf = NULL;
	c->rcap = c->rhead = c->rtail = c->rneed = 0;
	__atomic_store_n(&c->rtouched, 0, __ATOMIC_RELAXED);
}

void ferry__tcp_trim_arm(struct tcp_tp *t)
{
	if (t->trim_ms)
		return;
	t->trim_ms = tcp_now_ms() + TCP_TRIM_MS;
	ferry__tcp_timer_at(t, t->trim_ms);
}

/* the pool down to what the last window needed; @freed_p += the bytes
 * freed. Return: 1 while anything is held */
static int tcp_trim_log(struct tcp_conn *c, size_t *freed_p)
{
	struct tcp_chunk *drop = NULL, *ch;
	size_t keep;
	int held;

	pthread_mutex_lock(&c->lock);
	ferry__tcp_log_forget(c); /* the tail an ACK of ours went into, after the last ACK */
	keep = c->held_peak > c->oq_held ? c->held_peak - c->oq_held : 0;
	while (c->spare && c->spare_bytes > keep) {
		ch = c->spare;
		c->spare = ch->next;
		c->spare_bytes -= ch->cap;
		ch->next = drop;
		drop = ch;
	}
	c->held_peak = c->oq_held;
	held = c->spare_bytes || c->oq_held;
	pthread_mutex_unlock(&c->lock);
	/* freed outside the lock: senders need not wait for free() */
	for (; drop; drop = ch) {
		ch = drop->next;
		*freed_p += drop->cap;
		ferry__tcp_chunk_free(drop);
	}
	return held;
}

/* an empty receive buffer gives its pages back (@freed_p += the bytes of a
 * grown one, freed); Return: 1 while it holds some */
static int tcp_trim_rbuf(struct tcp_conn *c, size_t *freed_p)
{
	size_t pg = tcp_page(), touched = c->rtouched;
	int big = c->rbig > TCP_RBUF_SIZE / 2;

	c->rbig = 0;
	if (!c->rbuf || !touched)
		return 0;
	if (c->rhead != c->rtail || big)
		return 1; /* a frame is coming in, or large ones still come: in use */
	touched = (touched + pg - 1) / pg * pg;
	if (c->rcap > TCP_RBUF_SIZE) {
		ferry__tcp_rbuf_free(c); /* the next input maps TCP_RBUF_SIZE afresh */
		*freed_p += touched;
		return 0;
	}
	c->rhead = c->rtail = 0;
	if (madvise(c->rbuf, touched, MADV_DONTNEED))
		return 1; /* cannot fail on our own private memory; try again later */
	__atomic_store_n(&c->rtouched, 0, __ATOMIC_RELAXED);
	return 0;
}

int ferry__tcp_trim(struct tcp_tp *t)
{
	size_t freed = 0;
	int more = 0;

	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct tcp_conn *c = &t->conns[r];

		if (r == t->base.cfg.rank)
			continue;
		more |= tcp_trim_log(c, &freed);
		more |= tcp_trim_rbuf(c, &freed);
	}
#ifdef __GLIBC__
	/* a burst ended: what the core malloc'd for it (frames, per-key
	 * records of relocations) is free again, and malloc keeps it, in
	 * fastbins and in holes of its heap (on each node of ferry-bench -s
	 * memory, 1-2 MB after the moves, docs/benchmarks.md); malloc_trim()
	 * gives its free pages back (0.05-1 ms there). At most once a trim. */
	if (freed >= TCP_TRIM_HEAP)
		malloc_trim(0);
#endif
	return more;
}

size_t ferry__tcp_mem_held(struct ferry_tp *tp)
{
	struct tcp_tp *t = to_tcp(tp);
	size_t pg = tcp_page(), sum = 0;

	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct tcp_conn *c = &t->conns[r];
		size_t touched = __atomic_load_n(&c->rtouched, __ATOMIC_RELAXED);

		if (r == t->base.cfg.rank)
			continue;
		pthread_mutex_lock(&c->lock);
		sum += c->oq_held + c->spare_bytes;
		pthread_mutex_unlock(&c->lock);
		sum += (touched + pg - 1) / pg * pg;
	}
	return sum;
}
