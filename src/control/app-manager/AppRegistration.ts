/**
 * What a registration sets beside an app's source, and the rules it is held to: the names an app
 * may take, and the settings an app runs under, the registration's over the app's own (its
 * admission limits, its claim on shared tasks).
 */
import type { AdmissionSettings } from "../../app-runtime/App.js"
import type { AppShare } from "../DispatchContract.js"
import { type AdmissionLimits, unlimitedAdmission } from "./Admission.js"
import type { AdmissionOverride } from "./AppStore.js"

/** What a registration sets beside the app's source. */
export interface RegistrationSettings {
  /** Admission settings over the app's own. */
  readonly admission?: AdmissionOverride | undefined
  /** The SHA-256 of each API key the registration set for the app's invoke routes. */
  readonly apiKeyDigests?: ReadonlyArray<string> | undefined
  /** The hosts (`host` or `host:port`) the app may connect to, through its outbound proxy. */
  readonly outboundHosts?: ReadonlyArray<string> | undefined
  /** How long a request may take, its stream included, over the app's own `timeoutMs`. */
  readonly timeoutMs?: number | undefined
}

/** Queued requests wait this long by default before they are refused. */
export const defaultQueueTimeoutMs = 10_000

/** The limits an app runs under: the registration's settings over the app's own; none when neither sets any. */
export const admissionLimits = (
  own: AdmissionSettings | undefined,
  override: AdmissionOverride | undefined
): AdmissionLimits => {
  const maxConcurrency = override?.maxConcurrency ?? own?.maxConcurrency
  if (maxConcurrency === undefined) return unlimitedAdmission
  return {
    maxConcurrency,
    maxQueue: override?.maxQueue ?? own?.maxQueue ?? 0,
    queueTimeoutMs: override?.queueTimeoutMs ?? own?.queueTimeoutMs ?? defaultQueueTimeoutMs
  }
}

/** An app's claim on the tasks it shares: the registration's settings over the app's own. */
export const appShare = (
  app: string,
  own: AdmissionSettings | undefined,
  override: AdmissionOverride | undefined
): AppShare => {
  const maxCallsPerTask = override?.maxCallsPerTask ?? own?.maxCallsPerTask
  return {
    app,
    weight: override?.weight ?? own?.weight ?? 1,
    ...(maxCallsPerTask === undefined ? {} : { maxCallsPerTask })
  }
}

/** An app's name: it names its routes and its state. */
export const appNamePattern = /^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$/

/**
 * Names an app cannot take: `GET /app/logs/:id` is the gateway's, so an app named logs could not
 * be told from it (`/app/logs/docs` would be both its docs page and the logs of an app named docs).
 */
export const reservedAppNames: ReadonlySet<string> = new Set(["logs"])
