import { describe, expect, it } from 'vitest';
import { createActor, SimulatedClock } from 'xstate';
import { placementMachine, type PlacementContext } from '../../../machines/placement.machine.ts';
import { decideSwitch, type SwitchInput } from '../../../actors/placement/policy.ts';
import { placementDefaults } from '../../../actors/placement/config.ts';

const ctx = (over: Partial<PlacementContext> = {}): PlacementContext => ({
  mode: 'small',
  target: 'small',
  since: 0,
  switches: 0,
  reservation: false,
  reservedAt: 0,
  deadlineAt: 0,
  drainDelayMs: 0,
  ...over,
});
// The large model is placed only by the large mode, the small one only by the small mode.
const places = (mode: string, model: string): boolean => (model === 'big' ? mode === 'large' : mode === 'small');
const input = (over: Partial<SwitchInput> = {}): SwitchInput => ({
  now: 100_000,
  state: 'steady',
  context: ctx(),
  config: placementDefaults({ drainDeadlineMs: 30_000, minResidencyMs: 10_000, hysteresisMs: 250 }),
  demandSince: new Map(),
  places,
  largeImpossible: false,
  idle: () => false,
  ...over,
});

describe('placement machine', () => {
  it('moves steady → reserving → draining → switching → steady and counts the switch', () => {
    const clock = new SimulatedClock();
    const a = createActor(placementMachine, { input: { mode: 'small' }, clock }).start();
    a.send({ type: 'demand.shifted', target: 'large', t: 0, reservedAt: 0, deadlineAt: 30_000, drainDelayMs: 500 });
    expect(a.getSnapshot().value).toBe('reserving');
    expect(a.getSnapshot().context.reservation).toBe(true);
    clock.increment(499);
    expect(a.getSnapshot().value).toBe('reserving');
    clock.increment(1);
    expect(a.getSnapshot().value).toBe('draining');
    a.send({ type: 'replicas.drained' });
    expect(a.getSnapshot().value).toBe('switching');
    a.send({ type: 'replicas.loaded', t: 20_000 });
    expect(a.getSnapshot().value).toBe('steady');
    expect(a.getSnapshot().context).toMatchObject({ mode: 'large', since: 20_000, switches: 1, reservation: false });
  });

  it('releases the reservation when the demand subsides before the switch', () => {
    const a = createActor(placementMachine, { input: { mode: 'small' }, clock: new SimulatedClock() }).start();
    a.send({ type: 'demand.shifted', target: 'large', t: 0, drainDelayMs: 10_000 });
    a.send({ type: 'demand.subsided', t: 1 });
    expect(a.getSnapshot().value).toBe('steady');
    expect(a.getSnapshot().context).toMatchObject({ mode: 'small', target: 'small', reservation: false, switches: 0 });
  });

  it('settles on the mode that can exist when a GPU loss forces it, even mid-switch', () => {
    const a = createActor(placementMachine, { input: { mode: 'small' }, clock: new SimulatedClock() }).start();
    a.send({ type: 'demand.shifted', target: 'large', t: 0 });
    a.send({ type: 'reservation.held' });
    a.send({ type: 'replicas.drained' });
    a.send({ type: 'mode.forced', mode: 'small', t: 5 });
    expect(a.getSnapshot().value).toBe('steady');
    expect(a.getSnapshot().context).toMatchObject({ mode: 'small', target: 'small', reservation: false });
  });
});

describe('switch policy', () => {
  it('stays put while nothing waits for the other mode', () => {
    expect(decideSwitch(input({ demandSince: new Map([['small', 90_000]]) }))).toBeNull();
  });

  it('reserves at once for waiting large work, draining after the hysteresis and by the deadline counted from the wait', () => {
    const ev = decideSwitch(input({ demandSince: new Map([['big', 95_000]]) }));
    expect(ev).toEqual({
      type: 'demand.shifted',
      target: 'large',
      t: 100_000,
      reservedAt: 95_000,
      deadlineAt: 125_000,
      drainDelayMs: 250,
    });
  });

  it('spends the minimum residency inside the deadline window, never past it', () => {
    const young = decideSwitch(input({ context: ctx({ since: 98_000 }), demandSince: new Map([['big', 99_000]]) }));
    expect(young).toMatchObject({ deadlineAt: 129_000, drainDelayMs: 8_000 });
    const old = decideSwitch(input({ context: ctx({ since: 99_000 }), demandSince: new Map([['big', 75_000]]) }));
    expect(old).toMatchObject({ deadlineAt: 105_000, drainDelayMs: 5_000 });
  });

  it('the naive policy switches only once the node is idle', () => {
    const naive = { config: placementDefaults({ largeWaitReservation: false }), demandSince: new Map([['big', 0]]) };
    expect(decideSwitch(input({ ...naive, idle: () => false }))).toBeNull();
    expect(decideSwitch(input({ ...naive, idle: () => true }))).toMatchObject({
      type: 'demand.shifted',
      target: 'large',
      drainDelayMs: 0,
    });
  });

  it('lets the reservation go when the waiting work disappears', () => {
    const reserving = input({ state: 'reserving', context: ctx({ target: 'large', reservation: true }) });
    expect(decideSwitch(reserving)).toEqual({ type: 'demand.subsided', t: 100_000 });
    expect(decideSwitch({ ...reserving, demandSince: new Map([['big', 1]]) })).toBeNull();
  });

  it('falls back to the small mode when the gang cannot be placed', () => {
    expect(decideSwitch(input({ context: ctx({ mode: 'large', target: 'large' }), largeImpossible: true }))).toEqual({
      type: 'mode.forced',
      mode: 'small',
      t: 100_000,
    });
    expect(
      decideSwitch(input({ state: 'switching', context: ctx({ target: 'large' }), largeImpossible: true })),
    ).toMatchObject({ type: 'mode.forced' });
  });
});
