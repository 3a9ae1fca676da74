import { Chunk, Duration, Effect, Schedule } from "effect"
import { describe, expect, it } from "vitest"
import { healthyAfter, restartPolicy } from "../../src/process/RestartPolicy.js"

/** The waits the policy picks for runs that stayed up as long as `uptimes`, in milliseconds. */
const delaysAfter = (uptimes: ReadonlyArray<Duration.Duration>) =>
  Effect.runSync(Schedule.run(restartPolicy, 0, uptimes)).pipe(Chunk.toReadonlyArray, (delays) =>
    delays.map(Duration.toMillis)
  )

const crashedAtOnce = Duration.zero

describe("restartPolicy", () => {
  it("waits twice as long after each crash in a row, up to 8 s", () => {
    expect(delaysAfter(Array.from({ length: 8 }, () => crashedAtOnce))).toEqual([
      250, 500, 1_000, 2_000, 4_000, 8_000, 8_000, 8_000
    ])
  })

  it("restarts quickly again once a run stayed up for the healthy period", () => {
    expect(delaysAfter([crashedAtOnce, crashedAtOnce, crashedAtOnce, healthyAfter, crashedAtOnce])).toEqual([
      250, 500, 1_000, 250, 500
    ])
  })

  it("keeps backing off when each run ends just short of the healthy period", () => {
    const almostHealthy = Duration.subtract(healthyAfter, Duration.millis(1))
    expect(delaysAfter(Array.from({ length: 4 }, () => almostHealthy))).toEqual([250, 500, 1_000, 2_000])
  })
})
