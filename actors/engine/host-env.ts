// The environment an engine host starts with: an allow-list of what node and llama.cpp need, never the worker's
// secrets (its token, cloud credentials, anything else the worker was given), which a model file cannot ask for.

/** Variables passed through by exact name. */
const NAMES = new Set([
  'PATH',
  'HOME',
  'USER',
  'LOGNAME',
  'SHELL',
  'LANG',
  'LANGUAGE',
  'TZ',
  'TMPDIR',
  'TMP',
  'TEMP',
  'LD_LIBRARY_PATH',
  'XDG_CACHE_HOME',
  'SYSTEMROOT',
]);

/** Variables passed through by prefix: node's own, locale, and the GPU runtimes llama.cpp loads. */
const PREFIXES = ['NODE_', 'LC_', 'GGML_', 'LLAMA_', 'CUDA_', 'NVIDIA_', 'VULKAN_', 'VK_', 'HIP_', 'ROCR_', 'HSA_'];

/** True when the variable `name` may reach an engine host. */
export function hostMayInherit(name: string): boolean {
  return NAMES.has(name) || PREFIXES.some((p) => name.startsWith(p));
}

/** The allow-listed part of `env` (a fresh object; nothing else of the worker's environment). */
export function hostEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) if (value !== undefined && hostMayInherit(name)) out[name] = value;
  return out;
}
