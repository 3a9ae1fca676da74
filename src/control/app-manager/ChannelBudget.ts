/**
 * How fast an app's process may write to its channel. Every byte it writes costs the main thread
 * (buffered, checked, parsed and decoded there), so a process that writes without pause (a loop of
 * large messages nobody asked for) would hold the event loop that serves every app. Its bytes are
 * counted as they arrive against a token bucket: it may write `burstBytes` at once and
 * `bytesPerSecond` on average, and, on top, as many bytes as the platform sent it (an app that hands
 * its requests' media on to its tasks, or a task's output on to its client, sends what it was sent).
 * The bucket is the app's, across its processes: a process restarted after it ran dry starts dry.
 */
import { appMessageLimitBytes } from "../../app-runtime/driver/protocol.js"

export interface ChannelRate {
  /** What the app may write on average, beyond what it is sent. */
  readonly bytesPerSecond: number
  /** What it may write at once. */
  readonly burstBytes: number
}

/**
 * The average rate: 8 MiB a second, over four times the most an example writes (codec.ts, decoding
 * 24 kHz audio ten times faster than real time on a CPU, 1.8 MB a second; speak.ts 0.35 MB, paint.ts
 * 0.13 MB), most of which its tasks sent it and is credited besides; and a small share of what the
 * main thread can parse.
 */
export const channelBytesPerSecond = 8 * 1024 * 1024

/** The rate of an app whose answers may be `maxResponseBytes`: two of its largest messages back to back at any time. */
export const channelRateOf = (maxResponseBytes: number): ChannelRate => ({
  bytesPerSecond: channelBytesPerSecond,
  burstBytes: 2 * appMessageLimitBytes(maxResponseBytes)
})

const mib = (bytes: number) => `${Math.round((bytes / 1048576) * 10) / 10} MiB`

/** Why a process that wrote past its rate is stopped. */
export const channelRateExceeded = (rate: ChannelRate) =>
  `the app's process wrote to its channel faster than its bound of ${mib(rate.bytesPerSecond)} a second (${mib(rate.burstBytes)} at once) beyond what it was sent`

/** One app's token bucket of bytes. */
export class ChannelBudget {
  private level: number
  private at: number

  constructor(
    readonly rate: ChannelRate,
    private readonly now: () => number = () => performance.now()
  ) {
    this.level = rate.burstBytes
    this.at = now()
  }

  /** `bytes` arrived from the app: whether they are within its rate (they are taken from the bucket when they are). */
  spend(bytes: number): boolean {
    this.refill()
    if (bytes > this.level) return false
    this.level -= bytes
    return true
  }

  /** The platform sent the app `bytes`: as many may come back beyond the rate. */
  credit(bytes: number): void {
    this.refill()
    this.level = Math.min(this.rate.burstBytes, this.level + bytes)
  }

  private refill() {
    const now = this.now()
    this.level = Math.min(this.rate.burstBytes, this.level + ((now - this.at) / 1_000) * this.rate.bytesPerSecond)
    this.at = now
  }
}
