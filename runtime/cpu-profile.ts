// Profiling of child processes: with SWITCHYARD_CPU_PROF_DIR set, every node process switchyard spawns (serve from
// the benchmarks, the worker, each engine host) writes a V8 CPU profile there when it exits (`node --cpu-prof`, which
// NODE_OPTIONS does not accept). For diagnosis only: sampling costs CPU of its own.

/** The node flags that make a spawned process profile itself, or none. */
export function cpuProfileArgs(env: NodeJS.ProcessEnv = process.env): string[] {
  const dir = env['SWITCHYARD_CPU_PROF_DIR'];
  return dir ? ['--cpu-prof', '--cpu-prof-dir', dir] : [];
}
