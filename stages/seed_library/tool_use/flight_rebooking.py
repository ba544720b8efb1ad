# spade: domain=tool_use skill=multi-step-workflow
"""Airline desk: a passenger's flight was cancelled. Verify the booking, rebook onto the earliest
same-day flight with free seats, then choose a seat, add bags and issue the compensation voucher,
each phase only possible once the previous one is done."""

import json

CITIES = ["LIS", "MAD", "CDG", "AMS", "FRA", "CPH", "VIE", "DUB", "ATH", "OSL"]
SURNAMES = ["Moreno", "Lindgren", "Okonkwo", "Dubois", "Kowalski", "Yamamoto", "Haddad"]
DATES = ["2026-03-04", "2026-03-05", "2026-03-06", "2026-03-07"]
SEAT_TYPES = {"A": "window", "B": "middle", "C": "aisle", "D": "aisle", "E": "middle",
              "F": "window"}


def _hm(minutes):
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


class FlightRebookingEnv(ToolUseBaseEnv):
    max_turns = 14

    def setup(self):
        rng = self.rng
        origin, dest = rng.sample(CITIES, 2)
        date = rng.choice(DATES)
        surname = rng.choice(SURNAMES)
        pnr = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(6))
        numbers = rng.sample(range(100, 999), 8)
        airline = rng.choice(["SP", "TX", "LW"])
        flights = {}

        def add(number, dep, status, free):
            fid = f"{airline}{number}"
            seats = {}
            for row in range(10, 16):
                for letter in "ABCDEF":
                    seats[f"{row}{letter}"] = None
            taken = [s for s in sorted(seats)]
            rng.shuffle(taken)
            for s in taken[:len(seats) - free]:
                seats[s] = "taken"
            flights[fid] = {"origin": origin, "destination": dest, "date": date,
                            "departure": dep, "status": status, "seats": seats}
            return fid

        base = rng.choice([7, 8, 9]) * 60
        old = add(numbers[0], base, "cancelled", 10)
        full = add(numbers[1], base + 90, "scheduled", 0)
        add(numbers[2], base + 150, "cancelled", 12)
        best = add(numbers[3], base + rng.choice([180, 240]), "scheduled", rng.randint(4, 9))
        add(numbers[4], base + 420, "scheduled", 20)
        other_day = DATES[(DATES.index(date) + 1) % len(DATES)]
        early = add(numbers[5], base - 60, "scheduled", 15)
        flights[early]["date"] = other_day
        bags = rng.randint(1, 2)
        seat_type = rng.choice(["window", "aisle"])
        seats = flights[best]["seats"]
        if not any(v is None and SEAT_TYPES[k[-1]] == seat_type for k, v in seats.items()):
            wanted = sorted(k for k in seats if SEAT_TYPES[k[-1]] == seat_type)
            other = sorted(k for k, v in seats.items() if v is None)
            seats[rng.choice(wanted)] = None
            seats[rng.choice(other)] = "taken"
        self.state = {
            "flights": flights,
            "bookings": {pnr: {"last_name": surname, "flight": old, "seat": None, "bags": 0,
                               "vouchers": [], "history": [old]}},
            "upgrades": [],
        }
        bag_text = "one checked bag" if bags == 1 else "two checked bags"
        self.instructions = [
            f"Hello, booking {pnr}, last name {surname}. My flight {old} from {origin} to {dest} "
            f"on {date} was cancelled. Rebook me on the earliest flight that same day on that "
            "route which still has free seats.",
            f"Please give me a {seat_type} seat on the new flight.",
            f"Add {bag_text} to my booking.",
            "And issue the compensation voucher I am owed for the cancellation.",
        ]

        def seat_ok(s):
            b = s["bookings"][pnr]
            return (b["flight"] == best and b["seat"] is not None
                    and SEAT_TYPES[b["seat"][-1]] == seat_type)

        self.criteria = [
            lambda s: s["bookings"][pnr]["flight"] == best,
            seat_ok,
            lambda s: s["bookings"][pnr]["flight"] == best and s["bookings"][pnr]["bags"] == bags,
            lambda s: s["bookings"][pnr]["vouchers"] == ["cancellation"],
        ]
        self._plan = [
            ("get_booking", {"pnr": pnr, "last_name": surname}),
            ("search_flights", {"origin": origin, "destination": dest, "date": date}),
            ("rebook", {"pnr": pnr, "flight_no": best}),
            ("select_seat", {"pnr": pnr, "seat_type": seat_type}),
            ("add_bag", {"pnr": pnr}),
        ] + [("add_bag", {"pnr": pnr})] * (bags - 1) + [
            ("issue_voucher", {"pnr": pnr, "reason": "cancellation"}),
        ]
        del full
        pnr_param = {"type": "string", "description": "6-letter booking reference"}
        self.tools = {
            "get_booking": {
                "description": "Show a booking; the last name must match.",
                "parameters": {"type": "object", "properties": {
                    "pnr": pnr_param, "last_name": {"type": "string"}},
                    "required": ["pnr", "last_name"]}},
            "search_flights": {
                "description": "Flights on a route and date with departure time, status and number "
                               "of free seats.",
                "parameters": {"type": "object", "properties": {
                    "origin": {"type": "string"}, "destination": {"type": "string"},
                    "date": {"type": "string", "description": "YYYY-MM-DD"}},
                    "required": ["origin", "destination", "date"]}},
            "rebook": {
                "description": "Move a booking whose flight was cancelled onto another scheduled "
                               "flight with a free seat on the same route.",
                "parameters": {"type": "object", "properties": {
                    "pnr": pnr_param, "flight_no": {"type": "string"}},
                    "required": ["pnr", "flight_no"]}},
            "select_seat": {
                "description": "Assign a free seat of the requested type on the booking's flight.",
                "parameters": {"type": "object", "properties": {
                    "pnr": pnr_param,
                    "seat_type": {"type": "string", "enum": ["window", "middle", "aisle"]}},
                    "required": ["pnr", "seat_type"]}},
            "add_bag": {
                "description": "Add one checked bag to a booking on a scheduled flight.",
                "parameters": {"type": "object", "properties": {"pnr": pnr_param},
                               "required": ["pnr"]}},
            "issue_voucher": {
                "description": "Issue a compensation voucher for a disruption (once per booking).",
                "parameters": {"type": "object", "properties": {
                    "pnr": pnr_param,
                    "reason": {"type": "string", "enum": ["cancellation", "delay", "downgrade"]}},
                    "required": ["pnr", "reason"]}},
            "request_upgrade": {
                "description": "Ask for a paid cabin upgrade.",
                "parameters": {"type": "object", "properties": {
                    "pnr": pnr_param,
                    "cabin": {"type": "string", "enum": ["premium", "business"]}},
                    "required": ["pnr", "cabin"]}},
            "get_weather": {
                "description": "Weather forecast for an airport city code.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}},
        }

    # -- helpers ------------------------------------------------------------------------------
    def _booking(self, pnr):
        b = self.state["bookings"].get(str(pnr).strip().upper())
        if b is None:
            raise ValueError(f"no booking '{pnr}'")
        return b

    def _free(self, fid):
        return sum(v is None for v in self.state["flights"][fid]["seats"].values())

    # -- tools --------------------------------------------------------------------------------
    def tool_get_booking(self, pnr, last_name):
        b = self._booking(pnr)
        if str(last_name).strip().lower() != b["last_name"].lower():
            return "Error: the last name does not match this booking."
        f = self.state["flights"][b["flight"]]
        return json.dumps({"pnr": str(pnr).upper(), "flight": b["flight"],
                           "route": f"{f['origin']}-{f['destination']}", "date": f["date"],
                           "departure": _hm(f["departure"]), "flight_status": f["status"],
                           "seat": b["seat"], "bags": b["bags"], "vouchers": b["vouchers"]})

    def tool_search_flights(self, origin, destination, date):
        rows = []
        for fid, f in sorted(self.state["flights"].items(), key=lambda kv: kv[1]["departure"]):
            if (f["origin"] == str(origin).upper() and f["destination"] == str(destination).upper()
                    and f["date"] == str(date)):
                rows.append({"flight_no": fid, "departure": _hm(f["departure"]),
                             "status": f["status"], "free_seats": self._free(fid)})
        return json.dumps(rows) if rows else "No flights found."

    def tool_rebook(self, pnr, flight_no):
        b = self._booking(pnr)
        current = self.state["flights"][b["flight"]]
        if current["status"] != "cancelled":
            return f"Error: the booking is on {b['flight']}, which is not cancelled."
        new = self.state["flights"].get(str(flight_no).upper())
        if new is None:
            return f"Error: no flight '{flight_no}'."
        if (new["origin"], new["destination"]) != (current["origin"], current["destination"]):
            return "Error: that flight is on a different route."
        if new["status"] != "scheduled":
            return f"Error: {flight_no} is {new['status']}."
        if self._free(str(flight_no).upper()) == 0:
            return f"Error: {flight_no} is full."
        b["flight"] = str(flight_no).upper()
        b["history"].append(b["flight"])
        return f"Booking moved to {b['flight']} departing {_hm(new['departure'])} on {new['date']}."

    def tool_select_seat(self, pnr, seat_type):
        b = self._booking(pnr)
        if seat_type not in ("window", "middle", "aisle"):
            return "Error: seat_type must be window, middle or aisle."
        flight = self.state["flights"][b["flight"]]
        if flight["status"] != "scheduled":
            return "Error: seats cannot be chosen on a cancelled flight. Rebook first."
        for seat in sorted(flight["seats"]):
            if flight["seats"][seat] is None and SEAT_TYPES[seat[-1]] == seat_type:
                if b["seat"]:
                    flight["seats"][b["seat"]] = None
                flight["seats"][seat] = str(pnr).upper()
                b["seat"] = seat
                return f"Seat {seat} ({seat_type}) assigned on {b['flight']}."
        return f"Error: no free {seat_type} seat on {b['flight']}."

    def tool_add_bag(self, pnr):
        b = self._booking(pnr)
        if self.state["flights"][b["flight"]]["status"] != "scheduled":
            return "Error: bags cannot be added while the booking is on a cancelled flight."
        if b["bags"] >= 3:
            return "Error: at most 3 checked bags."
        b["bags"] += 1
        return f"Bag added; {b['bags']} checked bag(s) on {str(pnr).upper()}."

    def tool_issue_voucher(self, pnr, reason):
        b = self._booking(pnr)
        if reason not in ("cancellation", "delay", "downgrade"):
            return "Error: unknown reason."
        if b["vouchers"]:
            return "Error: a voucher was already issued for this booking."
        if len(b["history"]) < 2:
            return "Error: vouchers are issued after the passenger has been rebooked."
        b["vouchers"].append(reason)
        return f"Voucher for '{reason}' issued to {str(pnr).upper()}."

    def tool_request_upgrade(self, pnr, cabin):
        self._booking(pnr)
        self.state["upgrades"].append([str(pnr).upper(), cabin])
        return f"Upgrade request to {cabin} noted; an agent will quote a price."

    def tool_get_weather(self, city):
        return f"{str(city).upper()}: 14C, light wind."

    def solution(self):
        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in self._plan] + ["<answer>done</answer>"]
