// Owning pointers for sd-bus and sd-event objects.
#pragma once

#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include <memory>

namespace knod::bus {

struct BusUnref {
    void operator()(sd_bus *b) const { sd_bus_flush_close_unref(b); }
};
struct MessageUnref {
    void operator()(sd_bus_message *m) const { sd_bus_message_unref(m); }
};
struct SlotUnref {
    void operator()(sd_bus_slot *s) const { sd_bus_slot_unref(s); }
};
struct CredsUnref {
    void operator()(sd_bus_creds *c) const { sd_bus_creds_unref(c); }
};
struct EventUnref {
    void operator()(sd_event *e) const { sd_event_unref(e); }
};
struct SourceUnref {
    void operator()(sd_event_source *s) const { sd_event_source_disable_unref(s); }
};

using BusPtr = std::unique_ptr<sd_bus, BusUnref>;
using MessagePtr = std::unique_ptr<sd_bus_message, MessageUnref>;
using SlotPtr = std::unique_ptr<sd_bus_slot, SlotUnref>;
using CredsPtr = std::unique_ptr<sd_bus_creds, CredsUnref>;
using EventPtr = std::unique_ptr<sd_event, EventUnref>;
using SourcePtr = std::unique_ptr<sd_event_source, SourceUnref>;

// An sd_bus_error that frees itself.
struct BusError {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    ~BusError() { sd_bus_error_free(&e); }
    sd_bus_error *get() { return &e; }
};

} // namespace knod::bus
