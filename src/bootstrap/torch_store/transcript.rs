//! What torch 2.15.0+cu132's TCPStore client sent and its libuv server answered,
//! one step per client call, recorded by `scripts/capture-torch-store.py` (do not edit:
//! rerun it). The client prefixes every key with `/`; the ping nonce is the
//! client's process id. (Recorded against torch 2.15.0, the older server, `--legacy`,
//! answered the same bytes.)

/// One client call: its name, the bytes the client sent, the bytes the server answered.
pub(super) struct Step {
    pub name: &'static str,
    pub client: &'static str,
    pub server: &'static str,
}

/// The steps in the order they ran, against one server.
pub(super) const STEPS: &[Step] = &[
    Step { name: "connect", client: "00cef7853c0d2c070000", server: "2c070000" },
    Step { name: "set", client: "0105000000000000002f6b657931060000000000000076616c756531", server: "" },
    Step {
        name: "wait_then_get",
        client: "06010000000000000005000000000000002f6b6579310305000000000000002f6b657931",
        server: "00060000000000000076616c756531",
    },
    Step { name: "add_5", client: "0404000000000000002f6374720500000000000000", server: "0500000000000000" },
    Step { name: "add_minus_2", client: "0404000000000000002f637472feffffffffffffff", server: "0300000000000000" },
    Step { name: "check_ready", client: "05010000000000000005000000000000002f6b657931", server: "00" },
    Step {
        name: "check_not_ready",
        client: "05020000000000000005000000000000002f6b65793106000000000000002f6e6f6b6579",
        server: "01",
    },
    Step { name: "wait_ready", client: "06010000000000000005000000000000002f6b657931", server: "00" },
    Step { name: "wait_then_cancel", client: "06010000000000000006000000000000002f6e6f6b65790c", server: "01" },
    Step { name: "delete_present", client: "0805000000000000002f6b657931", server: "0100000000000000" },
    Step { name: "delete_absent", client: "0805000000000000002f6b657931", server: "0000000000000000" },
    Step {
        name: "wait_then_get_counter",
        client: "06010000000000000004000000000000002f6374720304000000000000002f637472",
        server: "00010000000000000033",
    },
];
