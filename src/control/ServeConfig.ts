import { Context } from "effect"

export type Role = "all" | "control-plane" | "data-plane"

/** Everything `cornserve serve` was told on its command line and in its environment. */
export interface ServeOptions {
  readonly role: Role
  readonly host: string
  readonly port: number
  readonly stateDir: string
  readonly devices: string
  /** This node's name among the platform's nodes (and its sidecar's). */
  readonly nodeId: string
  readonly sidecarArenaBytes: number
  readonly adminToken: string | undefined
  readonly maxBodyBytes: number
  readonly requestTimeoutMs: number
  readonly appLoadTimeoutMs: number
  readonly shutdownGraceMs: number
  readonly unregisterGraceMs: number
}

export class ServeConfig extends Context.Tag("cornserve/ServeConfig")<ServeConfig, ServeOptions>() {}
