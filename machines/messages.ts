// What machines say to other entities: data only. The runtime routes each `out` event to a local actor or over the wire.

/** A message a machine sends to another entity, as emitted data (`emit({ type: 'out', to, msg })`). */
export interface OutEvent {
  type: 'out';
  /** Destination system id (`gpu.3`, `replica.llama@v1#0`, `placement`, `req.17`). */
  to: string;
  msg: { type: string; [k: string]: unknown };
}
