import * as Duration from "effect/Duration"
import * as Schedule from "effect/Schedule"

/** A run that stayed up this long was healthy: a crash after it starts the backoff over. */
export const healthyAfter = Duration.seconds(30)

/**
 * When to start a crashed process or app worker again. Its input is how long the run that just
 * ended stayed up; its output is how long to wait before the next start. The wait doubles with
 * each crash in a row, from 250 ms up to 8 s, so that one that dies at once is not restarted in a
 * hot loop; a run that was up for `healthyAfter` starts the count over, so that a rare crash is
 * followed by a quick restart.
 */
export const restartPolicy: Schedule.Schedule<Duration.Duration, Duration.Duration> = Schedule.exponential(
  Duration.millis(250)
).pipe(
  Schedule.union(Schedule.spaced(Duration.seconds(8))),
  Schedule.delays,
  Schedule.intersect(Schedule.identity<Duration.Duration>()),
  Schedule.resetWhen(([, uptime]) => Duration.greaterThanOrEqualTo(uptime, healthyAfter)),
  Schedule.map(([delay]) => delay)
)
