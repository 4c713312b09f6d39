import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { SERVING_V8_FLAGS, tuneHeapForServing } from '../../runtime/heap-tuning.ts';

describe('heap tuning for serving processes', () => {
  it('applies every serving flag through the setter', () => {
    const seen: string[] = [];
    tuneHeapForServing((flag) => seen.push(flag));
    expect(seen).toEqual([...SERVING_V8_FLAGS]);
    expect(seen).toContain('--no-allocation-site-pretenuring');
  });

  // v8.setFlagsFromString ignores a flag it does not know, silently; the command line rejects one. Each flag is
  // checked there, so a misspelt or retired flag fails here instead of quietly doing nothing in production.
  it.each(SERVING_V8_FLAGS.map((flag) => [flag]))('V8 knows %s', (flag) => {
    const run = spawnSync(process.execPath, [flag, '-e', '0'], { encoding: 'utf8' });
    expect(run.stderr).toBe('');
    expect(run.status).toBe(0);
  });

  it('the check above rejects an unknown flag', () => {
    const run = spawnSync(process.execPath, ['--no-allocation-site-pretenurin', '-e', '0'], { encoding: 'utf8' });
    expect(run.status).not.toBe(0);
  });
});
