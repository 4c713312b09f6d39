// V8 settings for long-running serving processes (serve, node-agent), applied once at their start.
//
// Allocation-site pretenuring: when most objects from one allocation site (an object or array literal) survive young
// collections, V8 allocates that site's later objects directly in the old generation. In a server the lifetimes of a
// request's objects follow the load: a phase of long streams (1,024 concurrent 256-token streams in bench:live's
// throughput phase) makes the request path's sites "long-lived", and the decision outlasts the phase. Every later
// request's records then die in the old generation, which only a full collection frees, and the young objects they
// point to survive each scavenge through the old-to-new remembered set, are copied twice and promoted. Measured on
// serve at 1,000 req/s after such a phase (--trace-gc, three 5 s rounds, two runs each):
//
//   pretenuring on:  1.04-1.07 MB promoted per scavenge, mean pause 3.0 ms (p90 4.4-4.7), 2-4 full collections
//   pretenuring off: 0.19 MB promoted per scavenge,      mean pause 1.6-1.8 ms (p90 2.0), no full collection
//
// Without a long-stream phase first, pretenuring on gave 0.30 MB and 2.2 ms: the damage depends on the load's
// history, which is why young-collection pauses were bimodal between runs of one build. Turning the heuristic off
// costs nothing measurable here: objects that really live long (actors, tables, open streams) are promoted by age.
import { setFlagsFromString } from 'node:v8';

/** The V8 flags every serving process runs with (see above). */
export const SERVING_V8_FLAGS: readonly string[] = ['--no-allocation-site-pretenuring'];

/** Applies SERVING_V8_FLAGS to this process (setting a flag again is harmless). Call before serving begins. */
export function tuneHeapForServing(set: (flag: string) => void = setFlagsFromString): void {
  for (const flag of SERVING_V8_FLAGS) set(flag);
}
