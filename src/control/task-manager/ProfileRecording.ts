import * as Schema from "effect/Schema"

/**
 * The wire of a profile recorded ahead of time (`cornserve tasks profile ID --record`): what is
 * asked (`POST /tasks/:id/profile/record`), what each load level measured (the `progress` events of
 * its answer), and the recorded profile itself, as the answer's `final` event, `GET
 * /tasks/:id/profile`'s `recorded` and `<state-dir>/profiles/<task id>.json` carry it.
 */

/** Calls kept in flight at once: one load level of the sweep. */
export const Level = Schema.Int.pipe(Schema.between(1, 1024))
const SecondsPerLevel = Schema.Number.pipe(Schema.greaterThan(0), Schema.lessThanOrEqualTo(600))

export const defaultLevels = [1, 2, 4, 8] as const
export const defaultSecondsPerLevel = 5
/** Levels one recording may sweep: each runs for its seconds, one after another. */
export const maxLevels = 64

/**
 * A sweep's levels: its length is checked before its items, so that a huge array is refused at
 * once with one short message rather than checked item by item.
 */
const Levels = Schema.Array(Schema.Unknown).pipe(
  Schema.filter(
    (levels) =>
      (levels.length >= 1 && levels.length <= maxLevels) ||
      `a recording sweeps from 1 to ${maxLevels} levels, not ${levels.length}`,
    {
      identifier: "Levels"
    }
  ),
  Schema.compose(Schema.NonEmptyArray(Level))
)

export const RecordRequest = Schema.Struct({
  levels: Schema.optionalWith(Levels, { default: () => [...defaultLevels] }),
  secondsPerLevel: Schema.optionalWith(SecondsPerLevel, { default: () => defaultSecondsPerLevel })
})
export type RecordRequest = typeof RecordRequest.Type

/** A latency of no call at all is NaN, which JSON carries as null. */
const Milliseconds = Schema.transform(Schema.NullOr(Schema.Number), Schema.Number, {
  strict: true,
  decode: (value) => value ?? Number.NaN,
  encode: (value) => (Number.isFinite(value) ? value : null)
})

/** What one load level of a recording measured, told as soon as the level is done. */
export const LevelMeasured = Schema.Struct({
  level: Level,
  /** Executors the task had when the level ended. */
  executors: Schema.Int,
  /** How long the level ran: its seconds, and the calls still in flight at the end finishing. */
  seconds: Schema.Number,
  calls: Schema.Int,
  failed: Schema.Int,
  p50Ms: Milliseconds,
  /** Calls that succeeded per second of the level, as measured (not by Little's law). */
  callsPerSecond: Schema.Number
})
export type LevelMeasured = typeof LevelMeasured.Type

const CurvePoint = Schema.Struct({
  levelFrom: Schema.Int,
  levelTo: Schema.Int,
  meanLevel: Schema.Number,
  calls: Schema.Int,
  p50Ms: Schema.Number,
  p95Ms: Schema.Number,
  p99Ms: Schema.Number,
  meanMs: Schema.Number,
  callsPerSecond: Schema.Number
})

/** TaskProfile.ts's ProfileSummary, plus when and how it was recorded. */
export const RecordedProfile = Schema.Struct({
  calls: Schema.Int,
  failed: Schema.Int,
  recent: Schema.Struct({
    windowSeconds: Schema.Number,
    calls: Schema.Int,
    callsPerSecond: Schema.Number,
    p50Ms: Milliseconds,
    p99Ms: Milliseconds
  }),
  queueDepth: Schema.Struct({ mean: Schema.Number, max: Schema.Number, reports: Schema.Int }),
  curves: Schema.Array(Schema.Struct({ executors: Schema.Int, points: Schema.Array(CurvePoint) })),
  /** When the recording ended, ISO 8601. */
  recordedAt: Schema.String,
  levels: Schema.NonEmptyArray(Level),
  secondsPerLevel: SecondsPerLevel
})
export type RecordedProfile = typeof RecordedProfile.Type

/** The `final` event of a recording: the profile, and whether it is kept in the state dir. */
export const RecordingDone = Schema.Struct({
  taskId: Schema.String,
  message: Schema.String,
  recorded: RecordedProfile,
  kept: Schema.Boolean
})
export type RecordingDone = typeof RecordingDone.Type
