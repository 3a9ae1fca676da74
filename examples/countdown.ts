/**
 * A streaming app: counts down from `from` to 1, one line at a time. The gateway answers with
 * NDJSON, one JSON object per line, each sent as soon as it is produced.
 */
import { setTimeout as sleep } from "node:timers/promises"
import { Schema } from "effect"
import { defineApp } from "cornserve/app"

const Request = Schema.Struct({
  from: Schema.Int.pipe(Schema.between(1, 100)),
  /** Pause between lines, in milliseconds. */
  intervalMs: Schema.optionalWith(Schema.Int.pipe(Schema.between(0, 10_000)), { default: () => 200 })
})

const Line = Schema.Struct({ count: Schema.Int, done: Schema.Boolean })

export default defineApp({
  description: "Streams a countdown, one line per step.",
  tasks: {},
  request: Request,
  response: Line,
  example: { from: 5 },
  async *serve({ from, intervalMs }, { signal }) {
    for (let count = from; count >= 1; count--) {
      yield { count, done: count === 1 }
      if (count > 1) await sleep(intervalMs, undefined, { signal })
    }
  }
})
