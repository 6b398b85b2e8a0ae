/* SPDX-License-Identifier: MIT */
/*
 * cpu.h - spinning politely, on x86-64 and aarch64 alike (transport/base/:
 * the core and the transports both spin).
 *
 * ferry__cpu_relax() is one pause of a spin loop: PAUSE on x86 (it also
 * spares the sibling hyperthread), YIELD on aarch64, a compiler barrier
 * elsewhere. ferry__spin() is a whole back-off step: relax for the first
 * FERRY_SPIN_RELAX rounds, then give the CPU away with sched_yield(), so a
 * spinner cannot starve a preempted lock holder (a writer descheduled with
 * a slot's version odd) on a machine with few cores.
 */
#ifndef FERRY_TRANSPORT_BASE_CPU_H
#define FERRY_TRANSPORT_BASE_CPU_H

#include <sched.h>

#define FERRY_SPIN_RELAX 256u

static inline void ferry__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* one step of a bounded spin; @round counts the caller's rounds */
static inline void ferry__spin(unsigned *round)
{
	if (++*round < FERRY_SPIN_RELAX)
		ferry__cpu_relax();
	else
		sched_yield();
}

#endif /* FERRY_TRANSPORT_BASE_CPU_H */
